"""Background jobs for the dashboard: `gnq` commands run in their own process.

A job is a JSON file in ``<store folder>/jobs/`` listing the commands to run in order (e.g. an
audit, then the attack) and folders to delete at the end (uploads).  ``start_job`` launches
``python -m gnq_core.jobs JOBFILE`` in a new session, so the job outlives a page reload or the
Streamlit script; the page polls the job file and the run's progress in the store.  Cancelling
sends SIGTERM to the job's process group; the `gnq` commands treat it like Ctrl-C (run marked
'cancelled', finished checkpoints kept, a rerun resumes).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath


@dataclass
class Job:
    job_id: str
    run: str
    db: str
    steps: list[list[str]]
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
        tmp = self.path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, self.path)

    @classmethod
    def load(cls, path: Path) -> Job:
        return cls(**json.loads(path.read_text()))

    def alive(self) -> bool:
        if self.pid is None or self.status not in ("queued", "running"):
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(Path(self.log).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def jobs_dir(db: str | Path) -> Path:
    d = Path(db).resolve().parent / "jobs"
    d.mkdir(parents=True, exist_ok=True)
    return d


def uploads_dir(db: str | Path, job_id: str) -> Path:
    """A fresh folder for one job's uploaded files (deleted when the job ends)."""
    d = Path(db).resolve().parent / "uploads" / job_id
    d.mkdir(parents=True, exist_ok=False)
    return d


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def start_job(run: str, db: str | Path, steps: list[list[str]], cleanup: list[str | Path] = (),
              job_id: str | None = None) -> Job:
    """Write the job file and launch its runner in a new session (detached from Streamlit)."""
    job = Job(job_id=job_id or new_job_id(), run=run, db=str(Path(db).resolve()),
              steps=[[str(a) for a in s] for s in steps], cleanup=[str(c) for c in cleanup])
    job.log = str(job.path.with_suffix(".log"))
    job.save()
    with open(job.log, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "gnq_core.jobs", str(job.path)], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    job.pid = proc.pid
    job.status = "running"
    job.save()
    return job


def list_jobs(db: str | Path) -> list[Job]:
    """Jobs of this store, newest first; a job whose process died without a word is marked failed."""
    jobs = []
    for path in sorted(jobs_dir(db).glob("*.json"), reverse=True):
        try:
            job = Job.load(path)
        except (OSError, ValueError, TypeError):
            continue
        if job.status in ("queued", "running") and job.pid is not None and not job.alive():
            job = Job.load(path)  # it may have just finished and written its status
            if job.status in ("queued", "running"):
                job.status, job.finished = "failed", time.time()
                job.save()
        jobs.append(job)
    return jobs


def cancel_job(job: Job) -> None:
    if job.pid is not None and job.alive():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGTERM)


def safe_relative_path(name: str) -> PurePosixPath:
    """An uploaded file's relative path, refused if it could escape its folder."""
    normalized = name.replace("\\", "/")
    path = PurePosixPath(normalized)
    escapes = any(p in ("..", "") for p in path.parts)
    if not normalized or path.is_absolute() or escapes or ":" in path.parts[0]:
        raise ValueError(f"{name}: unsafe file name in upload (absolute or '..' paths are refused)")
    return path


def _run(job_path: Path) -> int:
    """The job process: run each step as `gnq ...`, record the outcome, clean up uploads."""
    job = Job.load(job_path)
    job.pid, job.status = os.getpid(), "running"
    job.save()
    rc = 0
    cancelled = False

    def on_term(signum, frame):  # noqa: ARG001
        nonlocal cancelled
        cancelled = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        for i, args in enumerate(job.steps):
            job.step = i
            job.save()
            print(f"$ gnq {' '.join(args)}", flush=True)
            child = subprocess.Popen([sys.executable, "-m", "gnq_core.cli", *args, "--db", job.db, "--quiet"])
            try:
                rc = child.wait()
            except KeyboardInterrupt:
                child.send_signal(signal.SIGTERM)
                child.wait()
                raise
            if rc != 0:
                break
    except KeyboardInterrupt:
        cancelled, rc = True, 130
    finally:
        for folder in job.cleanup:
            shutil.rmtree(folder, ignore_errors=True)
    job = Job.load(job_path)
    job.returncode, job.finished = rc, time.time()
    job.status = "cancelled" if cancelled else ("done" if rc == 0 else "failed")
    job.save()
    return rc


if __name__ == "__main__":
    sys.exit(_run(Path(sys.argv[1])))
