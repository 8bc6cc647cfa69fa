"""Files uploaded through the dashboard for one job: written below ``<store folder>/uploads/JOB/``
(results/layout.py), refused when a name could escape that folder, a link was planted, or they
exceed the upload limit or the free disk; deleted when the job ends (jobs.py)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Protocol

from gnq_core.common.atomic import check_target
from gnq_core.common.terminal import terminal_safe
from gnq_core.results.layout import uploads_root
from gnq_core.sources.limits import env_int

DEFAULT_MAX_UPLOAD_BYTES = 16 * 2**30


def uploads_dir(db: str | Path, job_id: str) -> Path:
    """A fresh folder for one job's uploaded files (deleted when the job ends)."""
    d = uploads_root(db) / job_id
    d.mkdir(parents=True, exist_ok=False)
    return d


# A staging folder of a session that has not started its job yet is "in use" while its session
# touches it (each run of the New audit page does); untouched this long, it is abandoned.
ABANDONED_AFTER_S = 24 * 3600


def touch_staging(folder: Path) -> None:
    """Mark a session's staging folder as in use now (its modification time)."""
    with contextlib.suppress(OSError):
        os.utime(folder)


def abandoned_uploads(db: str | Path, busy: set[str], now: float | None = None,
                      after_s: float = ABANDONED_AFTER_S) -> list[Path]:
    """Upload folders of this store that no live job (``busy``: job ids) uses and that no session
    has touched for ``after_s`` seconds: another session's staged uploads, waiting for its Start
    audit, are not abandoned."""
    root = uploads_root(db)
    now = time.time() if now is None else now
    try:
        folders = [p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and p.name not in busy]
    except OSError:
        return []
    return [p for p in folders if now - _last_touched(p) > after_s]


def _last_touched(folder: Path) -> float:
    """The latest modification time of the folder or anything in it (a file being uploaded too)."""
    try:
        return max([folder.stat().st_mtime] + [p.lstat().st_mtime for p in folder.rglob("*")])
    except OSError:
        return time.time()  # changing under us: in use


def max_upload_bytes() -> int:
    """The most one job may upload in all: ``$GNQ_MAX_UPLOAD_BYTES``, else 16 GiB."""
    return env_int("GNQ_MAX_UPLOAD_BYTES", DEFAULT_MAX_UPLOAD_BYTES, unit="a number of bytes")


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
    with _as_upload_error(str(into)):
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
        with _as_upload_error(f.name):
            _no_symlink_between(root, target, f.name)
            target.parent.mkdir(parents=True, exist_ok=True)
            check_target(target, "the upload")  # a FIFO or a device there is never written into
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
            fd = os.open(target, flags, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(f.getbuffer())


def _shown(name: str) -> str:
    """An upload's name for a message: control characters escaped, at most 80 characters."""
    safe = terminal_safe(name)
    return safe if len(safe) <= 80 else safe[:79] + "…"


@contextlib.contextmanager
def _as_upload_error(name: str) -> Iterator[None]:
    """An OSError (a name too long, a file where a folder must go, a full disk) as one ValueError line."""
    try:
        yield
    except OSError as exc:
        raise ValueError(f"{_shown(name)}: cannot save the upload ({exc.strerror or exc})") from None


def check_upload_tree(folder: Path) -> None:
    """Refuse a symlink in an upload folder that points outside it (uploads never contain links;
    one there was planted, and would let a job read a file it was not given)."""
    root = folder.resolve()
    for path in [folder, *folder.rglob("*")]:
        if path.is_symlink() and not inside(path.resolve(), root):
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
            raise ValueError(f"{_shown(name)}: unsafe file name in upload ({part.name} is a link)")


def inside(path: Path, folder: Path) -> bool:
    return Path(os.path.abspath(path)).is_relative_to(Path(os.path.abspath(folder)))


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n:,} bytes"


def remove_uploads(db: str | Path, folders: Sequence[str]) -> None:
    """Delete a job's upload folders; only ever folders inside this store's uploads folder."""
    root = uploads_root(db)
    for folder in folders:
        if inside(Path(folder), root) and Path(folder).resolve() != root.resolve():
            shutil.rmtree(folder, ignore_errors=True)


MAX_UPLOAD_DEPTH = 64  # folders in an uploaded file's name, the file included


def safe_relative_path(name: str) -> PurePosixPath:
    """An uploaded file's relative path, refused if it could escape its folder."""
    if "\0" in name:  # no file system takes it; os calls would say only "embedded null byte"
        raise ValueError(f"{_shown(name)}: a NUL character in an upload's file name; refused")
    normalized = name.replace("\\", "/")
    path = PurePosixPath(normalized)
    escapes = any(p in ("..", "") for p in path.parts)
    if not path.parts or path.is_absolute() or escapes or ":" in path.parts[0]:
        raise ValueError(f"{_shown(name)}: unsafe file name in upload (absolute or '..' paths are refused)")
    if len(path.parts) > MAX_UPLOAD_DEPTH:  # pathlib's mkdir(parents=True) recurses once per folder
        raise ValueError(f"{_shown(name)}: {len(path.parts) - 1} folders deep; an upload name may have at "
                         f"most {MAX_UPLOAD_DEPTH - 1}")
    return path
