"""`gnq` as a separate process that starts in moments: forked from a zygote, a process that has
imported torch, transformers and gnq once and does nothing else (no thread started, no tensor
made), so each child is a fresh `python -m gnq_core.cli` but for the ~4 s of imports.

For tests about what a process killed with SIGKILL leaves behind: no handler runs then, so how the
process started cannot matter.  Tests of start-up, of what reaches stderr, or of signal handling
start a real `python -m gnq_core.cli` (hostile_helpers.gnq_cmd)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# Imports that `gnq train`, `gnq audit` and `gnq extract` make on the way: a speed hint only (one
# missing after a rename is imported by the child itself, as a fresh process would).
PRELOAD = ["torch", "transformers", "transformers.models.gpt2.modeling_gpt2", "gnq_core.cli",
           "gnq_core.pipelines.run", "gnq_core.pipelines.train", "gnq_core.pipelines.audit",
           "gnq_core.attacks.run", "gnq_core.engine.auditor", "gnq_core.sources.checkpoints",
           "gnq_core.sources.models"]

ZYGOTE = r"""
import importlib, json, os, runpy, signal, sys
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except ImportError:
        pass
jobs = {}

def reap(*_):
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        path = jobs.pop(pid)
        with open(path + ".part", "w") as f:
            f.write(str(os.waitstatus_to_exitcode(status)))
        os.replace(path + ".part", path)

signal.signal(signal.SIGCHLD, reap)
print("ready", flush=True)
for line in sys.stdin:
    job = json.loads(line)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    pid = os.fork()
    if pid == 0:
        break
    jobs[pid] = job["exit_file"]
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    print(pid, flush=True)
else:
    sys.exit(0)
# The child: a fresh `python -m gnq_core.cli ARGS` from here on.
signal.signal(signal.SIGCHLD, signal.SIG_DFL)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
os.environ.clear()
os.environ.update(job["env"])
os.chdir(job["cwd"])
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
os.dup2(os.open(job["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 1)
os.dup2(os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
sys.argv = ["gnq", *job["argv"]]
runpy.run_module("gnq_core.cli", run_name="__main__", alter_sys=True)
"""


class Zygote:
    """The zygote process; ``start(*args)`` forks one `gnq ARGS` job from it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._proc = subprocess.Popen([sys.executable, "-c", ZYGOTE, json.dumps(PRELOAD)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._ready = False
        self._jobs: list[ZygoteJob] = []

    def start(self, *args: object, env: dict[str, str] | None = None) -> ZygoteJob:
        """`gnq ARGS` in this process's folder and environment (or ``env``); its stdout and stderr
        go to files (ZygoteJob.communicate reads them)."""
        if not self._ready:
            assert self._proc.stdout.readline().strip() == "ready", "the zygote did not start"
            self._ready = True
        files = self.folder / f"job-{len(self._jobs) + 1}"
        job = {"argv": [str(a) for a in args], "env": dict(os.environ if env is None else env),
               "cwd": os.getcwd(), **{k: f"{files}.{k}" for k in ("exit_file", "stdout", "stderr")}}
        self._proc.stdin.write(json.dumps(job) + "\n")
        self._proc.stdin.flush()
        self._jobs.append(ZygoteJob(int(self._proc.stdout.readline()), files))
        return self._jobs[-1]

    def close(self) -> None:
        """Ends the zygote, and any job a failed test left running."""
        for job in self._jobs:
            job.kill()
            job.wait()
        self._proc.stdin.close()
        self._proc.wait(timeout=60)


class ZygoteJob:
    """What kill_when needs of a subprocess.Popen, for a job the zygote forked (its parent, which
    reaps it and writes its exit code to ``exit_file``)."""

    def __init__(self, pid: int, files: Path) -> None:
        self.pid, self.files = pid, files
        self.exit_file = files.with_name(files.name + ".exit_file")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and self.exit_file.exists():
            self.returncode = int(self.exit_file.read_text())
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never signal a pid that may have been given to another process
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float = 120) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"gnq (pid {self.pid})", timeout, *self.output())
            time.sleep(0.005)
        return self.returncode

    def output(self) -> tuple[str, str]:
        """What the job wrote to stdout and stderr so far."""
        paths = [self.files.with_name(f"{self.files.name}.{k}") for k in ("stdout", "stderr")]
        return tuple(p.read_text(errors="replace") if p.exists() else "" for p in paths)

    def communicate(self, timeout: float = 120) -> tuple[str, str]:
        """Waits for the job to end; its stdout and stderr."""
        self.wait(timeout)
        return self.output()
