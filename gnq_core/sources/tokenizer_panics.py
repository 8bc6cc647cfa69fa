"""Rust tokenizer code run on an untrusted tokenizer.json can panic (a backtracking pre-tokenizer
regex hitting its retry limit).  pyo3 turns the panic into PanicException, a BaseException, and
Rust's panic hook first writes its own two lines ("thread ... panicked at ...", "note: run with
RUST_BACKTRACE=1") straight to file descriptor 2, past Python.  Around each such call, fd 2 goes
to a temporary file: after a panic its content is dropped and the user sees one line naming the
tokenizer's folder; otherwise it is written to stderr as it came (warnings are kept).

Every tokenizer loaded from a checkpoint folder has its Rust backend wrapped (``guard_backend``):
each call transformers makes into it that runs the tokenizer.json's code (encode, decode, and
their batch forms) is inside the guard, wherever in the tool the call comes from."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

from gnq_core.errors import GNQError

_LOCK = threading.Lock()  # fd 2 is the process's: one redirection at a time
_INSIDE = threading.local()  # a guard inside a guard (this thread) leaves the work to the outer one
# The backend's methods that run the tokenizer.json's normalizer, pre-tokenizer, model, decoder and
# post-processor (the rest read tables: token_to_id, get_vocab, ...).
_ON_TEXTS, _DECODING = "on the texts", "while decoding"
GUARDED_METHODS = {"encode": _ON_TEXTS, "encode_batch": _ON_TEXTS, "encode_batch_fast": _ON_TEXTS,
                   "post_process": _ON_TEXTS, "decode": _DECODING, "decode_batch": _DECODING}


class TokenizerFailure(GNQError, ValueError):
    """The tokenizer (from an untrusted tokenizer.json) failed inside its Rust code."""


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
    if getattr(_INSIDE, "active", False):
        yield
        return
    with _LOCK:
        sink = _sink()
        panicked = False
        _INSIDE.active = True
        try:
            with _stderr_to(sink):
                yield
        except BaseException as exc:
            if type(exc).__name__ != "PanicException":
                raise
            panicked = True
            reason = (str(exc).strip().splitlines() or ["panic"])[0]
            raise TokenizerFailure(f"{where}: {what} ({reason})") from None
        finally:
            _INSIDE.active = False
            sink.seek(0)
            kept = sink.read()
            sink.seek(0)
            sink.truncate()
            if kept and not panicked:
                with contextlib.suppress(OSError):
                    os.write(2, kept)


def _sink():
    """This thread's temporary file that fd 2 goes to during a guarded call (made once: a decode
    loop calls the guard per text)."""
    sink = getattr(_INSIDE, "sink", None)
    if sink is None or sink.closed:
        sink = _INSIDE.sink = tempfile.TemporaryFile()  # noqa: SIM115 (kept open for the thread)
    return sink


class GuardedBackend:
    """A ``tokenizers.Tokenizer`` whose encode/decode calls run inside ``panics_as_one_line``
    (naming ``where``, the tokenizer's folder); every other attribute is the backend's own."""

    __slots__ = ("_inner", "_where")

    def __init__(self, inner: Any, where: str) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_where", where)

    @property  # isinstance(backend, tokenizers.Tokenizer) still holds
    def __class__(self) -> type:  # type: ignore[override]
        return type(object.__getattribute__(self, "_inner"))

    def __getattr__(self, name: str) -> Any:
        value = getattr(object.__getattribute__(self, "_inner"), name)
        if name not in GUARDED_METHODS:
            return value
        where, what = object.__getattribute__(self, "_where"), f"the tokenizer failed {GUARDED_METHODS[name]}"

        @functools.wraps(value)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            with panics_as_one_line(where, what):
                return value(*args, **kwargs)

        return guarded

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_inner"), name, value)

    def __reduce__(self) -> tuple[type, tuple[Any, str]]:  # copy.deepcopy, pickle
        inner, where = object.__getattribute__(self, "_inner"), object.__getattribute__(self, "_where")
        return GuardedBackend, (inner, where)


def guard_backend(tokenizer: Any, where: str) -> Any:
    """``tokenizer`` (a transformers fast tokenizer) with its Rust backend wrapped in GuardedBackend;
    a tokenizer without one (a Python tokenizer) is returned as it is."""
    backend = getattr(tokenizer, "_tokenizer", None)
    rust = backend is not None and type(backend).__module__.startswith("tokenizers")
    if not rust or type(backend) is GuardedBackend:
        return tokenizer
    tokenizer._tokenizer = GuardedBackend(backend, where)
    return tokenizer
