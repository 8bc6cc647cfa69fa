"""Replacing a file atomically, the one way every layer does it: write a temporary file beside
it, then rename it over the target (readers and a crash see the old file or the new one, never
half of one).  A target that exists must be a regular file: a FIFO, a device (``/dev/null``), a
socket or a folder is refused, never replaced (``check_target``)."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from gnq_core.errors import GNQError


class TargetError(GNQError, ValueError):
    """An output path that exists and is not a regular file; the message names it."""


def _existing_mode(path: str | Path, what: str) -> int | None:
    """The file mode at ``path`` (links followed), None when nothing is there."""
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TargetError(f"{path}: cannot write {what} ({exc.strerror or exc})") from None


def check_target(path: str | Path, what: str = "the output") -> None:
    """Refuse ``path`` unless it is absent or a regular file (links followed: a link to
    ``/dev/null`` is a device).  ``what`` names the output in the messages."""
    if (mode := _existing_mode(path, what)) is None:
        return
    if stat.S_ISDIR(mode):
        raise TargetError(f"{path}: is a folder; give a file name for {what}")
    if not stat.S_ISREG(mode):
        raise TargetError(f"{path}: exists and is not a regular file (a device, FIFO or socket); refused")


def check_folder_target(path: str | Path, what: str = "the output folder") -> None:
    """Refuse ``path`` unless it is absent or a folder (a checkpoint folder is replaced whole: a
    file, FIFO or device there is never moved aside and removed)."""
    if (mode := _existing_mode(path, what)) is None:
        return
    if not stat.S_ISDIR(mode):
        raise TargetError(f"{path}: exists and is not a folder; refused as {what}")


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write; it replaces ``path`` when the block ends without
    an error and is removed otherwise.  ``path`` must be absent or a regular file (check_target),
    checked before and again just before the rename."""
    path = Path(path)
    check_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        check_target(path)  # made a FIFO or a device while we wrote: still never replaced
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | Path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)
