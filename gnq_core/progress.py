"""Progress of long jobs: a terminal bar (rich) and the run's progress fields in the store.

Engine code only calls ``reporter.stage(...)`` and ``reporter.advance(...)``; where that goes
(a bar with ETA, nothing with --quiet, the store so the dashboard can show it) is decided here.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class Reporter:
    """Forwards progress to an optional rich bar and an optional sink (e.g. the store), throttled."""

    def __init__(self, *, quiet: bool = True, sink: Callable[[int, int, str], None] | None = None,
                 sink_interval: float = 1.0) -> None:
        self.quiet = quiet
        self.sink = sink
        self.sink_interval = sink_interval
        self._bar: Progress | None = None
        self._task = None
        self._done = 0
        self._total = 0
        self._label = ""
        self._last_sink = 0.0
        self._started = False  # nothing reaches the sink before the first stage (a job that fails
        # while loading writes nothing to the store)

    def __enter__(self) -> Reporter:
        if not self.quiet:
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
            self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self._flush(force=True)
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def stage(self, label: str, total: int) -> None:
        """Start a new stage (one checkpoint, one epoch, the attack) with ``total`` units."""
        self._flush(force=True)
        self._started = True
        self._label, self._done, self._total = label, 0, total
        if self._bar is not None:
            if self._task is not None:
                self._bar.update(self._task, visible=False)
            self._task = self._bar.add_task(label, total=total)
        self._flush(force=True)

    def advance(self, n: int = 1) -> None:
        self._done += n
        if self._bar is not None and self._task is not None:
            self._bar.advance(self._task, n)
        self._flush()

    def log(self, message: str) -> None:
        if self._bar is not None:
            self._bar.console.print(message)
        elif not self.quiet:
            print(message)

    def _flush(self, force: bool = False) -> None:
        if self.sink is None or not self._started:
            return
        now = time.monotonic()
        if force or now - self._last_sink >= self.sink_interval:
            self._last_sink = now
            self.sink(self._done, self._total, self._label)
