"""Rust tokenizer code run on an untrusted tokenizer.json can panic (a backtracking pre-tokenizer
regex hitting its retry limit).  pyo3 turns the panic into PanicException, a BaseException, and
Rust's panic hook first writes its own two lines ("thread ... panicked at ...", "note: run with
RUST_BACKTRACE=1") straight to file descriptor 2, past Python.  Around each such call, fd 2 goes
to a temporary file: after a panic its content is dropped and the user sees one line naming the
tokenizer's folder; otherwise it is written to stderr as it came (warnings are kept)."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from collections.abc import Iterator

from gnq_core.errors import GNQError

_LOCK = threading.Lock()  # fd 2 is the process's: one redirection at a time


class TokenizerFailure(GNQError, ValueError):
    """The tokenizer (from an untrusted tokenizer.json) failed inside its Rust code."""


def _is_panic(exc: BaseException) -> bool:
    return type(exc).__name__ == "PanicException"


@contextlib.contextmanager
def _stderr_to(sink) -> Iterator[None]:
    with contextlib.suppress(ValueError, OSError):
        sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 to redirect (a daemon): the panic note goes nowhere anyway
        yield
        return
    os.dup2(sink.fileno(), 2)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError, OSError):
            sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def panics_as_one_line(where: str, what: str) -> Iterator[None]:
    """Run tokenizer code; a Rust panic becomes ``TokenizerFailure('<where>: <what> (<panic>)')``
    with nothing of Rust's own note on stderr."""
    with _LOCK, tempfile.TemporaryFile() as sink:
        panicked = False
        try:
            with _stderr_to(sink):
                yield
        except BaseException as exc:
            if not _is_panic(exc):
                raise
            panicked = True
            reason = (str(exc).strip().splitlines() or ["panic"])[0]
            raise TokenizerFailure(f"{where}: {what} ({reason})") from None
        finally:
            if not panicked:
                sink.seek(0)
                if kept := sink.read():
                    with contextlib.suppress(OSError):
                        os.write(2, kept)
