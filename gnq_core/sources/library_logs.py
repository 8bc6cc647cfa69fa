"""transformers' own log lines while a checkpoint is checked or loaded: held, and shown only when
the check passes.  A checkpoint refused in one line (``error: <folder>: <problem>``) would otherwise
come with transformers' warning about the same field above it ("Missing validation function for
'rope_type'='bogus'"); a checkpoint that loads keeps its warnings, shown as they came."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

LIBRARIES = ("transformers",)  # library loggers whose records are held


class _Hold(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def library_logs_held() -> Iterator[None]:
    """Hold the records of ``LIBRARIES``' loggers made inside the block; pass them on to their own
    handlers when it ends without an error, drop them when it raises (the error says it all)."""
    hold = _Hold()
    saved = []
    for name in LIBRARIES:
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers[:], logger.propagate))
        logger.handlers, logger.propagate = [hold], False
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers, logger.propagate = handlers, propagate
        if not failed:
            for record in hold.records:
                logging.getLogger(record.name).handle(record)
