"""One interruption, however many signals arrive: the first SIGINT/SIGTERM raises
KeyboardInterrupt; later ones are ignored while it is handled, so the run's final status
('cancelled') is written once and no second KeyboardInterrupt lands inside that clean-up (or inside
a DuckDB query, as ``Query interrupted``).  Ctrl-C twice 5 ms apart gives one status, no traceback.

Also: an interrupt before the command starts (while Python imports) is one line, not a traceback.
"""

from __future__ import annotations

import signal
import sys
import threading

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _later(signum, frame) -> None:  # noqa: ARG001
    """The first signal is being handled (the run is being marked): nothing more to do."""


def _first(signum, frame) -> None:  # noqa: ARG001
    for s in _SIGNALS:
        signal.signal(s, _later)
    raise KeyboardInterrupt


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
