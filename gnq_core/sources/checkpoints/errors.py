"""``CheckpointError``, the one error every checkpoint problem becomes, and how a failure is worded
as one: a line naming the file or folder."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from gnq_core.errors import GNQError, one_line
from gnq_core.sources import limits
from gnq_core.sources.library_logs import library_logs_held
from gnq_core.sources.tokenizer_panics import TokenizerFailure


class CheckpointError(GNQError, ValueError):
    """A checkpoint that cannot be found or loaded safely; the message is one line naming the file/folder."""


def reason(exc: BaseException) -> str:
    """What went wrong, in one line: the exception's first line (at most 300 characters) or its type."""
    return one_line(str(exc), limit=300) or type(exc).__name__


def folder_error(where: str | Path, problem: str) -> CheckpointError:
    return CheckpointError(one_line(f"{where}: {problem}", limit=600))


@contextlib.contextmanager
def as_checkpoint_error(folder: Path) -> Iterator[None]:
    """Any failure inside becomes one CheckpointError line naming the folder, and nothing else:
    transformers' log lines made meanwhile are shown only when nothing failed."""
    try:
        with library_logs_held():
            yield
    except (CheckpointError, TokenizerFailure):
        raise
    except limits.LimitError as exc:
        raise CheckpointError(str(exc)) from exc
    except Exception as exc:
        problem = f"cannot load the checkpoint ({type(exc).__name__}: {reason(exc)})"
        raise folder_error(folder, problem) from exc
