"""Background jobs for the dashboard: validated settings run by `gnq job` in their own process.

A job is a JSON file in ``<store folder>/jobs/`` listing the settings of its steps in order (e.g.
an audit, then the attack; ``gnq_core.pipelines.settings``) and folders to delete at the end
(uploads).  ``start_job`` launches ``python -m gnq_core.pipelines.jobs JOBFILE`` in a new session,
so the job outlives a page reload or the Streamlit script; it runs each step as ``gnq job JOBFILE
--step I``.  The page polls the job file and the run's progress in the store.  Cancelling sends
SIGTERM to the job's process group; `gnq` treats it like Ctrl-C (run marked 'cancelled', finished
checkpoints kept, a rerun resumes).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from gnq_core.atomic import write_text_atomic
from gnq_core.pipelines.kept import keep_last_checkpoint
from gnq_core.pipelines.settings import JobSettings, job_dict, job_from_dict
from gnq_core.progress import read_progress
from gnq_core.sources.datasets import env_bytes

DEFAULT_MAX_UPLOAD_BYTES = 16 * 2**30


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
        return cls(**json.loads(path.read_text()))

    def settings(self, step: int) -> JobSettings:
        if not 0 <= step < len(self.steps):
            raise ValueError(f"{self.path}: the job has {len(self.steps)} step(s), no step {step}")
        return job_from_dict(self.steps[step])

    def step_kind(self) -> str:
        step = self.steps[self.step] if self.step < len(self.steps) else {}
        return str(step.get("kind")) if isinstance(step, dict) else str(step[:1])  # an older job: argv

    def alive(self) -> bool:
        if self.pid is None or self.status not in ("queued", "running"):
            return False
        try:  # started by this process (the dashboard): reap it if it died, or it lingers as a zombie
            if os.waitpid(self.pid, os.WNOHANG)[0] == self.pid:
                return False
        except ChildProcessError:
            pass
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
        """The running step's progress (gnq_core.progress.ProgressFile), read without the store."""
        return read_progress(self.progress_path)

    def log_tail(self, lines: int = 20) -> str:
        """The end of the job's log (only ever a file in the jobs folder, whatever the job file says)."""
        log = Path(self.log)
        if not _inside(log, jobs_dir(self.db)):
            return ""
        try:
            return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def error_line(self) -> str | None:
        """The one-line error the failed `gnq` command printed (``error: ...``), if any."""
        found = [line for line in self.log_tail(200).splitlines() if line.startswith("error: ")]
        return found[-1] if found else None


def jobs_dir(db: str | Path, create: bool = True) -> Path:
    d = Path(db).resolve().parent / "jobs"
    if create:
        d.mkdir(parents=True, exist_ok=True)
    return d


def uploads_root(db: str | Path) -> Path:
    return Path(db).resolve().parent / "uploads"


def uploads_dir(db: str | Path, job_id: str) -> Path:
    """A fresh folder for one job's uploaded files (deleted when the job ends)."""
    d = uploads_root(db) / job_id
    d.mkdir(parents=True, exist_ok=False)
    return d


def max_upload_bytes() -> int:
    """The most one job may upload in all: ``$GNQ_MAX_UPLOAD_BYTES``, else 16 GiB."""
    return env_bytes("GNQ_MAX_UPLOAD_BYTES", DEFAULT_MAX_UPLOAD_BYTES)


class Upload(Protocol):
    """What save_uploads needs of an uploaded file (streamlit's UploadedFile has it)."""

    name: str
    size: int

    def getbuffer(self) -> memoryview: ...


# Written by the Hugging Face Trainer beside each checkpoint, never read by an audit or an attack:
# optimizer and scheduler state, RNG state, pickled training arguments.
SKIPPED_UPLOADS = re.compile(r"(?:optimizer|scheduler)\.(?:pt|bin)|rng_state(?:_\d+)?\.pth|training_args\.bin"
                             r"|scaler\.pt")


def skipped_upload(name: str) -> bool:
    """Whether an uploaded file is one an audit never reads (it is not saved)."""
    return bool(SKIPPED_UPLOADS.fullmatch(PurePosixPath(name.replace("\\", "/")).name))


def save_uploads(files: Sequence[Upload], into: Path, max_total_bytes: int | None = None) -> None:
    """Write uploaded files below ``into`` (all but ``skipped_upload`` ones); refuses names that
    would escape it ('..', absolute paths), writing through a symlink, more than
    ``max_total_bytes`` in all (a size bomb) and more than the disk has free.  A file already
    there with the same size is kept (Streamlit reruns).  Any OS failure (a name too long, a
    file where a folder must go, a read-only disk) is one ValueError line naming the file."""
    limit = max_upload_bytes() if max_total_bytes is None else max_total_bytes
    files = [f for f in files if not skipped_upload(f.name)]
    with _one_line(str(into)):
        into.mkdir(parents=True, exist_ok=True)
    root = into.resolve()
    total = sum(int(f.size) for f in files)
    if total > limit:
        raise ValueError(f"the upload is {_size(total)}, above the limit of {_size(limit)} per job "
                         "(GNQ_MAX_UPLOAD_BYTES); give large checkpoints as a local path instead")
    pending = [(f, root / safe_relative_path(f.name)) for f in files]
    needed = sum(int(f.size) for f, target in pending if not _same_size(target, f.size))
    free = shutil.disk_usage(root).free
    if needed > free:
        raise ValueError(f"the upload needs {_size(needed)} but {root} has only {_size(free)} free")
    for f, target in pending:
        if _same_size(target, f.size):
            continue
        with _one_line(f.name):
            _no_symlink_between(root, target, f.name)
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(f.getbuffer())


@contextlib.contextmanager
def _one_line(name: str) -> Iterator[None]:
    """An OSError (a name too long, a file where a folder must go, a full disk) as one ValueError line."""
    try:
        yield
    except OSError as exc:
        shown = name if len(name) <= 80 else name[:79] + "…"
        raise ValueError(f"{shown}: cannot save the upload ({exc.strerror or exc})") from None


def check_upload_tree(folder: Path) -> None:
    """Refuse a symlink in an upload folder that points outside it (uploads never contain links;
    one there was planted, and would let a job read a file it was not given)."""
    root = folder.resolve()
    for path in [folder, *folder.rglob("*")]:
        if path.is_symlink() and not _inside(path.resolve(), root):
            raise ValueError(f"{path}: a link to {os.readlink(path)!r}, outside the upload folder; refused")


def _same_size(target: Path, size: int) -> bool:
    try:
        return target.is_file() and not target.is_symlink() and target.stat().st_size == size
    except OSError:  # a name too long, say: the write says so, naming the file
        return False


def _no_symlink_between(root: Path, target: Path, name: str) -> None:
    for part in [target, *target.parents]:
        if part == root:
            return
        if part.is_symlink():
            raise ValueError(f"{name}: unsafe file name in upload ({part.name} is a link)")


def _inside(path: Path, folder: Path) -> bool:
    return Path(os.path.abspath(path)).is_relative_to(Path(os.path.abspath(folder)))


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n:,} bytes"


def _remove_uploads(db: str | Path, folders: Sequence[str]) -> None:
    """Delete a job's upload folders; only ever folders inside this store's uploads folder."""
    root = uploads_root(db)
    for folder in folders:
        if _inside(Path(folder), root) and Path(folder).resolve() != root.resolve():
            shutil.rmtree(folder, ignore_errors=True)


def _finish_uploads(job: Job) -> None:
    """Keep the run's last audited checkpoint out of the uploads (later attacks need it), then
    delete the uploads."""
    if job.cleanup:
        try:
            keep_last_checkpoint(job.db, job.run, job.cleanup)
        except Exception as exc:  # noqa: BLE001 (the uploads are deleted all the same)
            print(f"error: could not keep the last checkpoint of {job.run!r} ({exc})", flush=True)
    _remove_uploads(job.db, job.cleanup)


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def start_job(run: str, db: str | Path, steps: Sequence[JobSettings], cleanup: Sequence[str | Path] = (),
              job_id: str | None = None) -> Job:
    """Write the job file and launch its runner in a new session (detached from Streamlit)."""
    job = Job(job_id=job_id or new_job_id(), run=run, db=str(Path(db).resolve()),
              steps=[json.loads(json.dumps(job_dict(s), default=str)) for s in steps],
              cleanup=[str(c) for c in cleanup])
    job.log = str(job.path.with_suffix(".log"))
    job.save()
    with open(job.log, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "gnq_core.pipelines.jobs", str(job.path)], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    job.pid = proc.pid
    job.status = "running"
    job.save()
    return job


def list_jobs(db: str | Path) -> list[Job]:
    """Jobs of this store, newest first; a job whose process died without a word is marked failed."""
    jobs = []
    for path in sorted(jobs_dir(db, create=False).glob("*.json"), reverse=True):  # none: no folder made
        if path.name.endswith(".progress.json"):
            continue
        try:
            job = Job.load(path)
        except (OSError, ValueError, TypeError):
            continue
        if job.status in ("queued", "running") and job.pid is not None and not job.alive():
            job = Job.load(path)  # it may have just finished and written its status
            if job.status in ("queued", "running"):  # killed (kill -9, a crash): tidy up after it
                job.status, job.finished = "failed", time.time()
                job.save()
                _finish_uploads(job)
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
    if not path.parts or path.is_absolute() or escapes or ":" in path.parts[0]:
        raise ValueError(f"{name}: unsafe file name in upload (absolute or '..' paths are refused)")
    return path


def _run(job_path: Path) -> int:
    """The job process: run each step as `gnq job`, record the outcome, clean up uploads."""
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
        for i, step in enumerate(job.steps):
            job.step = i
            job.save()
            print(f"$ gnq job {job_path} --step {i}  # {json.dumps(step)}", flush=True)
            child = subprocess.Popen([sys.executable, "-m", "gnq_core.cli", "job", str(job_path),
                                      "--step", str(i), "--db", job.db, "--quiet"],
                                     env=dict(os.environ, GNQ_PROGRESS_FILE=str(job.progress_path)))
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
        _finish_uploads(job)
    job = Job.load(job_path)
    job.returncode, job.finished = rc, time.time()
    job.status = "cancelled" if cancelled else ("done" if rc == 0 else "failed")
    job.save()
    return rc


if __name__ == "__main__":
    sys.exit(_run(Path(sys.argv[1])))
