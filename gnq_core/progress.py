"""Progress of long jobs: a terminal bar (rich) and the run's progress fields in the store.

Engine code only calls ``reporter.stage(...)`` and ``reporter.advance(...)``; where that goes
(a bar with ETA, nothing with --quiet, the store so the dashboard can show it) is decided here.
"""

from __future__ import annotations

import contextlib
import copy
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from gnq_core.atomic import write_text_atomic
from gnq_core.terminal import markup_safe, terminal_safe


class Reporter:
    """Forwards progress to an optional rich bar and an optional sink (e.g. the store), throttled."""

    def __init__(self, *, quiet: bool = True, sink: Callable[[int, int, str], None] | None = None) -> None:
        self.quiet = quiet
        self.sink = sink
        self.sink_interval = 1.0  # seconds between the sink's writes (stage changes always go through)
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
            self._task = self._bar.add_task(markup_safe(label), total=total)  # folder names: untrusted
        self._flush(force=True)

    def advance(self, n: int = 1) -> None:
        self._done += n
        if self._bar is not None and self._task is not None:
            self._bar.advance(self._task, n)
        self._flush()

    def log(self, message: str) -> None:
        if self._bar is not None:
            self._bar.console.print(terminal_safe(message), markup=False, highlight=False)
        elif not self.quiet:
            print(terminal_safe(message))

    def _flush(self, force: bool = False) -> None:
        if self.sink is None or not self._started:
            return
        now = time.monotonic()
        if force or now - self._last_sink >= self.sink_interval:
            self._last_sink = now
            self.sink(self._done, self._total, self._label)


class ProgressFile:
    """A Reporter sink that keeps a job's progress in a small JSON file, so the dashboard can show
    it (with an estimate) without opening the store the job is writing to.  One instance serves
    every Reporter of a process: it counts stages across them (``planned_stages``, when known,
    gives an estimate for the whole job)."""

    def __init__(self, path: str | Path, planned_stages: int | None = None) -> None:
        self.path = Path(path)
        self.planned_stages = planned_stages
        self.started = time.time()
        self._stage, self._label, self._stage_started = 0, None, self.started

    def __call__(self, done: int, total: int, label: str) -> None:
        now = time.time()
        if label != self._label:
            self._stage, self._label, self._stage_started = self._stage + 1, label, now
        state = {"label": label, "done": done, "total": total, "stage": self._stage,
                 "planned_stages": self.planned_stages, "started": self.started,
                 "stage_started": self._stage_started, "updated": now}
        with contextlib.suppress(OSError):  # progress is a courtesy: never fail the job over it
            write_text_atomic(self.path, json.dumps(state))

    def plan(self, stages: int | None) -> None:
        """A new step of the job begins with this many stages (None: unknown); counted afresh."""
        self.planned_stages, self._stage, self._label = stages, 0, None


class RunProgress(Protocol):
    """What JobProgress needs of the store: its runs and their progress fields (results.store.Store)."""

    def find_run(self, name: str) -> Any: ...

    def set_progress(self, run_id: int, done: int, total: int, note: str | None = None) -> None: ...


def run_ref(store: RunProgress, name: str) -> Callable[[], int | None]:
    """The id of the run ``name`` once the job has created it (looked up until then, kept after)."""
    found: list[int] = []

    def get() -> int | None:
        if not found and (run := store.find_run(name)) is not None:
            found.append(run.run_id)
        return found[0] if found else None

    return get


class JobProgress:
    """The one channel a job's progress goes through: it makes a Reporter per run (a bar unless
    ``quiet``), whose sink writes the run's progress fields in the store (``gnq runs``, the Runs
    page) and, for a dashboard job, the job's progress file.  ``warn`` prints a notice (stderr)."""

    def __init__(self, store: RunProgress | None = None, *, quiet: bool = True,
                 file: ProgressFile | None = None, warn: Callable[[str], None] | None = None) -> None:
        self.store, self.quiet, self.file = store, quiet, file
        self.warn = warn or (lambda message: print(message, file=sys.stderr, flush=True))

    def plan(self, stages: int | None) -> None:
        if self.file is not None:
            self.file.plan(stages)

    def planned(self, stages: int) -> JobProgress:
        """This channel for a job run as several jobs (the demo): ``stages`` planned once for them
        all, the jobs' own plans ignored."""
        self.plan(stages)
        steps = copy.copy(self)
        steps.plan = lambda stages: None  # type: ignore[method-assign]
        return steps

    def reporter(self, run: str | None = None) -> Reporter:
        """A Reporter for the run named ``run``; its progress goes to the store once the job has
        created the run."""
        run_id = run_ref(self.store, run) if run is not None and self.store is not None else None

        def sink(done: int, total: int, label: str) -> None:
            if run_id is not None and self.store is not None and (found := run_id()) is not None:
                self.store.set_progress(found, done, total, label)
            if self.file is not None:
                self.file(done, total, label)

        return Reporter(quiet=self.quiet, sink=sink if run is not None or self.file is not None else None)


def read_progress(path: str | Path) -> dict[str, Any] | None:
    """What a ProgressFile last wrote, or None."""
    try:
        state = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def seconds_left(state: dict[str, Any], now: float | None = None) -> float | None:
    """Estimated seconds until the job ends (all planned stages), else until the current stage ends,
    from the rate so far; None before there is a rate to go by."""
    now = time.time() if now is None else now
    done, total, stage = state.get("done") or 0, state.get("total") or 0, state.get("stage") or 0
    planned = state.get("planned_stages")
    in_stage = done / total if total else 0.0
    if planned and stage:
        fraction = min(1.0, (stage - 1 + in_stage) / planned)
        elapsed = now - state["started"]
    else:
        fraction, elapsed = in_stage, now - state.get("stage_started", now)
    if fraction <= 0.01:
        return None
    return max(0.0, elapsed * (1 - fraction) / fraction)
