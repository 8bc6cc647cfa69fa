"""The errors a user can cause, and the one line each is shown as (by ``gnq``, a dashboard job's
log and the pages): a bad file, an unknown run, a busy store, a model the engine cannot audit
exactly.  Each module keeps its own class (DatasetError, CheckpointError, StoreError, ...); all
derive from GNQError, whose first line names the file or run and the problem."""

from __future__ import annotations

import re


class GNQError(Exception):
    """Base of gnq_core's user-facing errors: the message's first line says it all."""


def user_errors() -> tuple[type[BaseException], ...]:
    """What ``gnq`` and a dashboard job report as one line, exit code 1 (not a traceback): the
    GNQErrors (a model with a layer the engine has no kernel for among them), a refused value, a
    failed write."""
    return GNQError, ValueError, OSError


def one_line(exc: BaseException | str, limit: int | None = None, *, whole: bool = False) -> str:
    """The message's first line, stripped (an empty message: the exception's type name, or "" for a
    string); an OSError as its file and cause (disk full, read-only folder:
    ``out/epoch-2/model.safetensors: No space left on device``).  ``whole``: every line of the text,
    joined by a space (a message whose later lines matter).  ``limit``: at most that many characters,
    the last one "…"."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        target = f" -> {exc.filename2}" if exc.filename2 else ""
        line = f"{exc.filename}{target}: {exc.strerror}"
    elif whole:
        line = re.sub(r"\s*[\r\n\u2028\u2029\x0b\x0c\x1c-\x1e\x85]+\s*", " ", str(exc)).strip()
    else:
        text = str(exc).strip()
        line = text.splitlines()[0].strip() if text else "" if isinstance(exc, str) else type(exc).__name__
    return line if limit is None or len(line) <= limit else line[: limit - 1] + "…"
