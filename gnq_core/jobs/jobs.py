"""Background jobs for the dashboard: validated settings run by ``run_job`` in a process of their own.

A job is a JSON file in ``<store folder>/jobs/`` (results/layout.py) listing the settings of its
steps in order (e.g. an audit, then the attack; ``gnq_core.pipelines.settings``) and folders to
delete at the end (uploads).  ``start_job`` launches ``python -m gnq_core.jobs.jobs JOBFILE``
in a new session, so the job outlives a page reload or the Streamlit script; that process runs
each step with ``run_job`` (pipelines/run.py), the very function the ``gnq`` commands call.  The
page polls the job file and the job's progress file.  Cancelling writes ``JOB.cancel`` (who asked,
when: the history says so) and sends SIGTERM to the job's process group, handled like Ctrl-C: the
run is marked 'cancelled', finished checkpoints are kept, a rerun resumes.  Any session lists and
cancels every job of the store from these files alone (none of it lives in a session).  A run
is written by one job at a time: a second start of a run whose job is alive is refused
(``JobConflict``), so two starts never race on one run and the history holds one row per attempt.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gnq_core.common.atomic import write_text_atomic
from gnq_core.common.progress import read_progress
from gnq_core.errors import GNQError
from gnq_core.jobs.kept import keep_last_checkpoint
from gnq_core.jobs.uploads import inside, remove_uploads
from gnq_core.pipelines.settings import JobSettings, job_dict, job_from_dict
from gnq_core.results.layout import jobs_dir


@dataclass
class Job:
    job_id: str
    run: str
    db: str
    steps: list[dict[str, Any]]  # settings as JSON (settings.job_dict)
    cleanup: list[str] = field(default_factory=list)
    status: str = "queued"  # queued | running | done | failed | cancelled
    step: int = 0
    pid: int | None = None
    returncode: int | None = None
    started: float = field(default_factory=time.time)
    finished: float | None = None
    log: str = ""

    @property
    def path(self) -> Path:
        return jobs_dir(self.db) / f"{self.job_id}.json"

    def save(self) -> None:
        write_text_atomic(self.path, json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> Job:
        return cls(**json.loads(path.read_text(encoding="utf-8")))

    def settings(self, step: int) -> JobSettings:
        if not 0 <= step < len(self.steps):
            raise ValueError(f"{self.path}: the job has {len(self.steps)} step(s), no step {step}")
        return job_from_dict(self.steps[step])

    def step_kind(self) -> str:
        step = self.steps[self.step] if self.step < len(self.steps) else {}
        return str(step.get("kind")) if isinstance(step, dict) else "?"

    def alive(self) -> bool:
        if self.pid is None or self.status not in ("queued", "running"):
            return False
        # started by this process (the dashboard): reap it if it died, or it lingers as a zombie;
        # its wait status is the one record of how it ended when it could not write its own (a kill)
        with contextlib.suppress(ChildProcessError):
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                _ended_unrecorded(self, os.waitstatus_to_exitcode(status))
                return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    @property
    def progress_path(self) -> Path:
        return self.path.with_suffix(".progress.json")

    def progress(self) -> dict | None:
        """The running step's progress (gnq_core.common.progress.ProgressFile), read without the store."""
        return read_progress(self.progress_path)

    def log_tail(self, lines: int = 20) -> str:
        """The end of the job's log (only ever a file in the jobs folder, whatever the job file says)."""
        log = Path(self.log)
        if not inside(log, jobs_dir(self.db)):
            return ""
        try:
            return "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    @property
    def cancel_path(self) -> Path:
        return self.path.with_suffix(".cancel")

    def cancel_requested(self) -> float | None:
        """When Cancel was pressed for this job (in any session), None if it never was."""
        try:
            return float(json.loads(self.cancel_path.read_text(encoding="utf-8"))["at"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def error_line(self) -> str | None:
        """The one-line error the failed step printed (``error: ...``), if any."""
        found = [line for line in self.log_tail(200).splitlines() if line.startswith("error: ")]
        return found[-1] if found else None


def _finish_uploads(job: Job) -> None:
    """Keep the run's last audited checkpoint out of the uploads (later attacks need it), then
    delete the uploads."""
    if job.cleanup:
        try:
            keep_last_checkpoint(job.db, job.run, job.cleanup)
        except Exception as exc:  # noqa: BLE001 (the uploads are deleted all the same)
            print(f"error: could not keep the last checkpoint of {job.run!r} ({exc})", flush=True)
    remove_uploads(job.db, job.cleanup)


INTERRUPTED = 130  # the exit code of a job stopped by SIGTERM/SIGINT before it could record it


def _ended_unrecorded(job: Job, returncode: int | None) -> None:
    """A job whose process is gone while its file still says queued or running: it was killed
    (kill -9, the out-of-memory killer), stopped inside an import (interrupts.py: a signal there
    ends the process at once, exit code 130) or died before it could write its outcome.  Marked
    'cancelled' when Cancel was pressed or it exited as interrupted (what was asked happened),
    else 'failed', with ``returncode`` (-N: killed by signal N; None: not known, the process was
    not ours to reap), and its uploads cleaned up.  A job that wrote its own outcome is left as it is."""
    fresh = Job.load(job.path)  # it may have just finished and written its status
    if fresh.status in ("queued", "running"):
        stopped = fresh.cancel_requested() is not None or returncode == INTERRUPTED
        fresh.status = "cancelled" if stopped else "failed"
        fresh.finished, fresh.returncode = time.time(), returncode
        fresh.save()
        _finish_uploads(fresh)


class JobConflict(GNQError, ValueError):
    """A start refused: a live job is already writing that run."""


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def live_job(db: str | Path, run: str) -> Job | None:
    """The job that is writing ``run`` in this store now, if one is."""
    return next((j for j in list_jobs(db) if j.run == run and j.alive()), None)


def start_job(run: str, db: str | Path, steps: Sequence[JobSettings], cleanup: Sequence[str | Path] = (),
              job_id: str | None = None) -> Job:
    """Write the job file and launch its process in a new session (detached from Streamlit).
    Refused (``JobConflict``) while another job of this store is writing ``run``: the two would
    audit the same checkpoints into one run at once."""
    if (busy := live_job(db, run)) is not None:
        raise JobConflict(f"run {run!r} is being written by the job started at "
                          f"{time.strftime('%H:%M:%S', time.localtime(busy.started))} (still {busy.status}): "
                          "cancel it first (its finished checkpoints are kept; starting again resumes), "
                          "or give this audit another name")
    job = Job(job_id=job_id or new_job_id(), run=run, db=str(Path(db).resolve()),
              steps=[json.loads(json.dumps(job_dict(s), default=str)) for s in steps],
              cleanup=[str(c) for c in cleanup])
    job.log = str(job.path.with_suffix(".log"))
    job.save()
    with open(job.log, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "gnq_core.jobs.jobs", str(job.path)], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    job.pid = proc.pid
    job.status = "running"
    job.save()
    return job


def list_jobs(db: str | Path) -> list[Job]:
    """Jobs of this store, the latest started first (a job's id is when its page was opened, not
    when it started); a job whose process died without a word is marked failed."""
    jobs = []
    for path in jobs_dir(db, create=False).glob("*.json"):  # none: no folder made
        if path.name.endswith(".progress.json"):
            continue
        try:
            job = Job.load(path)
        except (OSError, ValueError, TypeError):
            continue
        if job.status in ("queued", "running") and job.pid is not None and not job.alive():
            _ended_unrecorded(job, None)  # killed (kill -9, a crash) and not reaped here: tidy up after it
            job = Job.load(path)
        jobs.append(job)
    return sorted(jobs, key=lambda j: (j.started, j.job_id), reverse=True)


def cancel_job(job: Job) -> None:
    """Ask the job to stop (SIGTERM to its process group, handled like Ctrl-C), noting that Cancel
    was pressed, so its history reads "cancelled from the dashboard" rather than by a signal."""
    if job.pid is not None and job.alive():
        if job.cancel_requested() is None:
            write_text_atomic(job.cancel_path, json.dumps({"at": time.time()}))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGTERM)


def run_steps(job_path: Path) -> int:
    """The job process: run each step with ``run_job``, record the outcome, clean up uploads.
    A step's user error ends the job with one ``error: ...`` line in its log (exit code 1)."""
    from gnq_core.common import interrupts
    from gnq_core.common.progress import JobProgress, ProgressFile
    from gnq_core.errors import one_line, user_errors
    from gnq_core.pipelines.run import run_job
    from gnq_core.results.store import Store

    job = Job.load(job_path)
    job.pid, job.status = os.getpid(), "running"
    job.save()
    interrupts.install()  # cancel = Ctrl-C: the run is marked 'cancelled', once however many signals
    store = Store(job.db, on_wait=lambda message: print(message, flush=True))
    progress = JobProgress(store, file=ProgressFile(job.progress_path),
                           warn=lambda message: print(message, flush=True))
    rc, cancelled = 0, False
    try:
        for i, step in enumerate(job.steps):
            job.step = i
            job.save()
            print(f"$ step {i}: {json.dumps(step)}", flush=True)
            try:
                for line in run_job(job.settings(i), store, progress):
                    print(line, flush=True)
            except Exception as exc:  # a bug: its traceback in the log; either way the job failed
                if isinstance(exc, user_errors()):
                    print(f"error: {one_line(exc)}", flush=True)
                else:
                    traceback.print_exc()
                rc = 1
                break
    except KeyboardInterrupt:
        cancelled, rc = True, INTERRUPTED
    finally:
        _finish_uploads(job)
    job = Job.load(job_path)
    job.returncode, job.finished = rc, time.time()
    job.status = "cancelled" if cancelled else ("done" if rc == 0 else "failed")
    job.save()
    return rc


if __name__ == "__main__":
    from gnq_core.common.terminal import encodable_streams

    encodable_streams()  # the job's log under the C locale: escapes, not an encoding error
    sys.exit(run_steps(Path(sys.argv[1])))
