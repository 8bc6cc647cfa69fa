"""Progress of long jobs: a terminal bar (rich) and the run's progress fields in the store.

Engine code only calls ``reporter.stage(...)`` and ``reporter.advance(...)``; where that goes
(a bar with ETA, nothing with --quiet, the store so the dashboard can show it) is decided here.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from rich import get_console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from gnq_core.common.atomic import write_text_atomic
from gnq_core.common.terminal import markup_safe, terminal_safe

# What a stage counts, in its own word (the progress bar and the dashboard say "12/92 texts").
TEXTS, SECRET_VALUES, BATCHES = "texts", "secret values", "batches"


def _clock(seconds: float) -> str:
    """0:42, 3:05, 1:02:09."""
    s = max(0, round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class _EtaColumn(ProgressColumn):
    """The time left, from the Reporter's own smoothed rates (``StageRate``), counting down between
    updates: rich's own column goes blank when no update came within its 30 s window (a batch of a
    0.5B model on a CPU takes longer).  ``field``: the stage's ("eta_at") or the whole run's."""

    def __init__(self, field: str, word: str) -> None:
        super().__init__()
        self.field, self.word = field, word

    def render(self, task: Task) -> Text:
        at = task.fields.get(self.field)
        if at is None:
            return Text(f"{self.word} -:--", style="progress.remaining")
        return Text(f"{self.word} {_clock(max(1.0, at - time.time()))}", style="progress.remaining")


class Reporter:
    """Forwards progress to an optional rich bar and an optional sink (e.g. the store), throttled.

    On a terminal the bar shows the stage's ETA and, once the job has said how much work the
    whole run holds (``expect``), the whole run's; without a terminal (output to a file, a pipe)
    a plain line says the same at least every ``PLAIN_INTERVAL`` seconds, from a timer thread so
    a long batch or load does not silence it.  ``phase`` labels work that counts nothing yet
    (loading a checkpoint, planning)."""

    PLAIN_INTERVAL = 20.0  # seconds between the plain lines (a log file hears something every 30 s)

    def __init__(self, *, quiet: bool = True,
                 sink: Callable[[int, int, str, str], None] | None = None) -> None:
        """``sink(done, total, label, unit)``: where the stage's progress goes besides the bar."""
        self.quiet = quiet
        self.sink = sink
        self.sink_interval = 1.0  # seconds between the sink's writes (stage changes always go through)
        self._bar: Progress | None = None
        self._task = None
        self._done = 0
        self._total = 0
        self._label = ""
        self._unit = TEXTS
        self._last_sink = 0.0
        self._started = False  # nothing reaches the sink before the first stage (a job that fails
        # while loading writes nothing to the store)
        self._entered = time.time()
        self._stage_started = self._entered
        self._phase: str | None = None
        self._rate = StageRate(self._entered)
        self._run_total: int | None = None  # units of the whole run (every stage), once expected
        self._run_done = 0
        self._run_rate: StageRate | None = None
        self._ticker: threading.Event | None = None
        self._stage_end: float | None = None
        self._run_end: float | None = None

    def __enter__(self) -> Reporter:
        self._entered = time.time()
        if not self.quiet and get_console().is_terminal:
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[unit]}"), TimeElapsedColumn(),
                                 _EtaColumn("eta_at", "ETA"), _EtaColumn("run_eta_at", "run ETA"))
            self._bar.start()
        elif not self.quiet:
            self._ticker = threading.Event()
            threading.Thread(target=self._tick, args=(self._ticker,), name="gnq-progress-lines",
                             daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._flush(force=True)
        if self._ticker is not None:
            self._ticker.set()
            self._ticker = None
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def expect(self, total: int, unit: str = TEXTS) -> None:
        """The whole run holds ``total`` units (of ``unit``, every stage's together): the run's ETA
        is measured over them, loads and stage changes between them included."""
        self._run_total, self._run_done = total, 0
        self._run_rate = StageRate(time.time(), tau=300.0)

    def phase(self, label: str) -> None:
        """Work that counts nothing yet (planning, loading a checkpoint), shown by its label until
        the next stage starts."""
        self._phase = label
        if self._bar is not None:
            if self._task is not None:
                self._bar.update(self._task, visible=False)
            self._task = self._bar.add_task(markup_safe(f"{label} …"), total=None, unit="", eta_at=None,
                                            run_eta_at=self._run_end)

    def stage(self, label: str, total: int, unit: str = TEXTS) -> None:
        """Start a new stage (one checkpoint, one epoch, the attack) of ``total`` things it works
        on, counted in their own word ``unit`` (TEXTS, SECRET_VALUES, ...)."""
        self._flush(force=True)
        self._started = True
        self._phase = None
        self._label, self._done, self._total, self._unit = label, 0, total, unit
        self._stage_started = time.time()
        self._rate = StageRate(self._stage_started)
        self._stage_end = None
        if self._bar is not None:
            if self._task is not None:
                self._bar.update(self._task, visible=False)
            # folder names: untrusted
            self._task = self._bar.add_task(markup_safe(label), total=total, unit=markup_safe(unit),
                                            eta_at=None, run_eta_at=self._run_end)
        self._flush(force=True)

    def advance(self, n: int = 1) -> None:
        now = time.time()
        self._done += n
        self._rate.update(self._done, now)
        if self._run_rate is not None:
            self._run_done += n
            self._run_rate.update(self._run_done, now)
        # when the stage and the run will end, as of this update: counted down until the next one
        self._stage_end, self._run_end = self._eta_at(now), self._run_eta_at(now)
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, advance=n, eta_at=self._stage_end, run_eta_at=self._run_end)
        self._flush()

    def _eta_at(self, now: float | None = None) -> float | None:
        """When the stage will end, by its smoothed rate (None before one is measured)."""
        now = time.time() if now is None else now
        rate = self._rate.rate
        return None if not rate else now + max(0, self._total - self._done) / rate

    def _run_eta_at(self, now: float | None = None) -> float | None:
        """When the whole run will end, by its smoothed rate over every stage (None before one)."""
        now = time.time() if now is None else now
        if self._run_rate is None or self._run_total is None or not self._run_rate.rate:
            return None
        return now + max(0, self._run_total - self._run_done) / self._run_rate.rate

    def status_line(self, now: float | None = None) -> str:
        """The plain progress line: what runs, how far, for how long, and the ETAs known."""
        now = time.time() if now is None else now
        if self._phase is not None or not self._started:
            what = f"{self._phase or 'starting'} …"
        else:
            what = f"{self._label}: {self._done}/{self._total} {self._unit}"
        parts = [terminal_safe(what), f"elapsed {_clock(now - self._entered)}"]
        if self._phase is None and self._started and (at := self._stage_end) is not None:
            parts.append(f"ETA {_clock(max(1.0, at - now))}")
        if (run_at := self._run_end) is not None:
            parts.append(f"run ETA {_clock(max(1.0, run_at - now))}")
        return ", ".join(parts)

    def _tick(self, stop: threading.Event) -> None:
        while not stop.wait(self.PLAIN_INTERVAL):
            print(self.status_line(), file=sys.stderr, flush=True)

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
            self.sink(self._done, self._total, self._label, self._unit)


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
        self._rate = StageRate(self.started)

    def __call__(self, done: int, total: int, label: str, unit: str = TEXTS) -> None:
        now = time.time()
        if label != self._label:
            self._stage, self._label, self._stage_started = self._stage + 1, label, now
            self._rate = StageRate(now)
        rate = self._rate.update(done, now)
        state = {"label": label, "done": done, "total": total, "unit": unit, "stage": self._stage,
                 "planned_stages": self.planned_stages, "started": self.started,
                 "stage_started": self._stage_started, "updated": now, "rate": rate}
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

        def sink(done: int, total: int, label: str, unit: str = TEXTS) -> None:
            if run_id is not None and self.store is not None and (found := run_id()) is not None:
                self.store.set_progress(found, done, total, label)
            if self.file is not None:
                self.file(done, total, label, unit)

        return Reporter(quiet=self.quiet, sink=sink if run is not None or self.file is not None else None)


def read_progress(path: str | Path) -> dict[str, Any] | None:
    """What a ProgressFile last wrote, or None."""
    try:
        state = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


class StageRate:
    """A stage's own measured rate (units a second), smoothed: an exponential moving average of
    the rates between updates, each weighted by the time it covers (``1 − e^(−dt/tau)``), so a
    steady rate gives a steady estimate and a slower stretch moves it within about ``tau``.
    Units counted without work (too-short texts skipped at once) move the baseline, not the
    rate: an update less than ``MIN_INTERVAL`` after the previous one is no measurement."""

    MIN_INTERVAL = 0.5  # seconds

    def __init__(self, started: float, tau: float = 60.0) -> None:
        self.tau = tau
        self._done, self._at = 0, started
        self.rate: float | None = None

    def update(self, done: int, now: float) -> float | None:
        """The smoothed rate after ``done`` units at time ``now`` (None until one is measured)."""
        dt = now - self._at
        if done <= self._done:
            return self.rate
        if dt < self.MIN_INTERVAL:
            self._done, self._at = done, now
            return self.rate
        measured = (done - self._done) / dt
        weight = 1.0 - math.exp(-dt / self.tau)
        self.rate = measured if self.rate is None else weight * measured + (1 - weight) * self.rate
        self._done, self._at = done, now
        return self.rate


def seconds_left(state: dict[str, Any], now: float | None = None) -> float | None:
    """Estimated seconds until the current stage ends, from that stage's own smoothed rate
    (StageRate), counted down since the last update; never below a second while its work
    remains.  0 when the last planned stage has counted all its work; None while there is no
    rate to go by, or when a stage has counted all its work and more stages follow."""
    now = time.time() if now is None else now
    done, total, stage = state.get("done") or 0, state.get("total") or 0, state.get("stage") or 0
    planned, rate = state.get("planned_stages"), state.get("rate")
    if "rate" not in state and done > 0:  # written by an older job: the stage's average rate so far
        spent = state.get("updated", now) - state.get("stage_started", now)
        rate = done / spent if spent > 0 else None
    if done >= total:
        return 0.0 if not planned or stage >= planned else None
    if not rate or rate <= 0:
        return None
    since = max(0.0, now - state.get("updated", now))
    return max(1.0, (total - done) / rate - since)


def job_seconds_left(state: dict[str, Any], now: float | None = None) -> float | None:
    """Estimated seconds until the whole job ends: the current stage's (``seconds_left``) plus
    each planned stage still to come taken as long as the finished ones were on average; None
    without planned stages, before one has finished, or without the current stage's estimate."""
    stage, planned = state.get("stage") or 0, state.get("planned_stages")
    left = seconds_left(state, now)
    if not planned or stage < 2 or left is None:
        return None
    per_stage = (state.get("stage_started", 0.0) - state.get("started", 0.0)) / (stage - 1)
    return left + max(0, planned - stage) * max(0.0, per_stage)
