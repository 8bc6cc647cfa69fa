"""The next checkpoint loaded while this one is audited, in a daemon thread: an interrupted audit
exits at once (a ThreadPoolExecutor's worker is joined at exit, and once pinned the process for
15 minutes waiting on a load blocked on the import lock)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Prefetch:
    """``fn(arg)`` started in a daemon thread; ``result()`` waits for it (interruptibly) and returns
    its value or raises its exception."""

    def __init__(self, fn: Callable[[Any], Any], arg: Any) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, args=(fn, arg), name="gnq-checkpoint-loader", daemon=True).start()

    def _run(self, fn: Callable[[Any], Any], arg: Any) -> None:
        try:
            self._value = fn(arg)
        except BaseException as exc:  # handed to the main thread by result()
            self._error = exc
        finally:
            self._done.set()

    def result(self) -> Any:
        while not self._done.wait(0.2):  # short waits: a signal reaches the main thread at once
            pass
        if self._error is not None:
            raise self._error
        return self._value
