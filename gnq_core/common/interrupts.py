"""One interruption, however many signals arrive: the first SIGINT/SIGTERM raises
KeyboardInterrupt; later ones are ignored while it is handled, so the run's final status
('cancelled') is written once and no second KeyboardInterrupt lands inside that clean-up (or inside
a DuckDB query, as ``Query interrupted``).  Ctrl-C twice 5 ms apart gives one status, no traceback.

Before that, while Python imports typer, rich and torch (up to seconds), ``guard_startup`` makes a
signal end the process at once with one line and exit code 130: nothing has been written yet.
The entry points install it before importing anything heavy (``gnq_core.launcher``, and
``gnq_core/__init__`` for ``python -m gnq_core.cli`` / ``-m gnq_core.jobs.jobs``); only
Python's own start-up (its ``site`` module, the first tens of milliseconds) comes before it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _later(signum, frame) -> None:  # noqa: ARG001
    """The first signal is being handled (the run is being marked): nothing more to do."""


def _importing(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib."):
            return True
        frame = frame.f_back
    return False


def _first(signum, frame) -> None:
    # Inside an import (torch's C++ start-up calls back into Python), an exception aborts the
    # process ("terminate called after throwing ..."): end it as during start-up instead.
    if _importing(frame):
        _exit_now(signum, frame)
    for s in _SIGNALS:
        signal.signal(s, _later)
    raise KeyboardInterrupt


def _exit_now(signum, frame) -> None:  # noqa: ARG001
    os.write(2, b"interrupted\n")
    os._exit(130)


def guard_startup() -> None:
    """Until ``install`` takes over: SIGINT or SIGTERM ends the process with one line, exit code 130."""
    if threading.current_thread() is threading.main_thread():
        for s in _SIGNALS:
            signal.signal(s, _exit_now)


def install() -> None:
    """SIGINT and SIGTERM (how the dashboard cancels a job) raise KeyboardInterrupt once."""
    if threading.current_thread() is threading.main_thread():
        for s in _SIGNALS:
            signal.signal(s, _first)


def quiet_interrupt_at_exit() -> None:
    """An interrupt that escapes everything (e.g. during the imports before a command starts)
    prints one line instead of a traceback."""
    previous = sys.excepthook

    def hook(kind, value, tb) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.stderr.write("interrupted\n")
            return
        previous(kind, value, tb)

    sys.excepthook = hook
