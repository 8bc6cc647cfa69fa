"""Leaks caught while training: every ``every`` optimizer steps, the secret-like values of the
training set are probed under the current weights, the post-hoc secret attack's own way
(attacks/secret_attack.py ``attack_secrets``: greedy continuation after the text up to each value,
and its exposure over the value's own randomness, with the run's null of never-trained values),
and the outcome is kept per value and step.

    from gnq_core.integrations.hf import GNQConfig, GNQTrainer
    from gnq_core.integrations.tracking import SecretTracking

    gnq = GNQConfig(out="runs/ft", texts=texts, track_secrets=SecretTracking(tokenizer, every=50,
                                                                               on_leak="stop"))

A plain training loop uses ``SecretTracker`` itself: ``tracker.step(model, step)`` after each
optimizer step, and stop when ``tracker.should_stop``.

What is measured at a step is what the attack measures on a checkpoint: *leaked* = the model
writes every letter and digit of the value; *exposed* = its exposure is above the 99th percentile
of never-trained values of its format (no reference model during training: the null alone, said
so in the rows' rule).  The probes' cost is held to ``max_overhead`` (default 10%) of the
training time they watch (wall-clock): the greedy continuation runs every ``every`` steps (put
off, ``deferred``, only while its own share would pass the bound), and the exposure (the post-hoc
budget: 97% of a probe's cost on the benchmark) is added to a probe when all the probes' share
stays within the bound (the first probe forecasts its cost from one value's exposure, each probe
with it measures it again; ``without_exposure`` lists the probes made without it).
``max_overhead=None``: both at every ``every`` steps, whatever it costs.
``on_leak`` — "warn" (one line on stderr naming the step, the value's
kind and its text id, never the value) or "stop" (the Trainer's ``should_training_stop``, at the
step it came out) — acts when a value comes out whole or, with ``act_on_exposed``, crosses the
null's threshold.  The rows go to ``secret_tracking.parquet`` in the shards folder (step, text
id, kind, value, characters written, exposure, the null's threshold), and a few numbers to the
Trainer's log (``secrets/leaked``, ``secrets/exposed``, ``secrets/max_exposure``).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from transformers import TrainerCallback

from gnq_core.attacks.defaults import DEFAULT_SECRET_CANDIDATES
from gnq_core.attacks.exposure import DEFAULT_SEARCH_NODES
from gnq_core.attacks.secret_attack import attack_secrets
from gnq_core.common.values import finite, one_of, require, whole
from gnq_core.results.shard_files import SECRET_TRACKING_COLUMNS, TRACKING_FILE
from gnq_core.results.store_schema import partly_leaked
from gnq_core.sources.secrets import find_secrets

__all__ = ["DEFAULT_EVERY", "DEFAULT_MAX_OVERHEAD", "TRACKING_FILE", "SecretTracker", "SecretTracking",
           "SecretTrackingCallback", "check_tracking"]

DEFAULT_EVERY = 50  # optimizer steps between two probes
DEFAULT_MAX_OVERHEAD = 0.10  # probes' seconds / training's seconds (benchmarks/secret_tracking.py)
TRACK_COLUMNS = SECRET_TRACKING_COLUMNS


@dataclass
class SecretTracking:
    """What to probe while training, how often, and what to do when a value comes out."""

    tokenizer: Any  # the model's tokenizer (decodes the continuations)
    every: int = DEFAULT_EVERY
    on_leak: str = "warn"  # "warn" or "stop"
    act_on_exposed: bool = False  # also act when a value crosses the null's threshold
    n_candidates: int = DEFAULT_SECRET_CANDIDATES  # the post-hoc attack's budget (1: no exposure)
    search_nodes: int = DEFAULT_SEARCH_NODES
    batch_size: int = 32
    seed: int = 0
    texts: Sequence[str] | None = None  # by example_id; default: GNQConfig.texts
    # The most the probes may cost, as a share of the training time they watch (wall-clock seconds):
    # exposure is left out of a probe, or the whole probe put off, while it would take the share
    # above this (its cost estimated by the last one's); None: everything every ``every`` steps.
    max_overhead: float | None = DEFAULT_MAX_OVERHEAD

    def __post_init__(self) -> None:
        whole(self.every, "SecretTracking every (optimizer steps between probes)", 1)
        one_of(self.on_leak, "SecretTracking on_leak", ("warn", "stop"))
        whole(self.n_candidates, "SecretTracking n_candidates", 1)
        whole(self.search_nodes, "SecretTracking search_nodes", 1)
        whole(self.batch_size, "SecretTracking batch_size", 1)
        require(self.tokenizer is not None, "SecretTracking tokenizer: give the model's tokenizer")
        if self.max_overhead is not None:
            finite(self.max_overhead, "SecretTracking max_overhead (share of the training time)", 0.0,
                   above=True)


@dataclass
class SecretTracker:
    """The probe and its history, for any training loop (the Trainer's callback wraps it).
    ``texts`` and ``token_ids``: the training texts and their training tokens, by position;
    ``example_ids`` their ids (default 0..n-1)."""

    settings: SecretTracking
    texts: Sequence[str]
    token_ids: Sequence[Sequence[int]]
    example_ids: Sequence[int] | None = None
    max_length: int = 1024
    rows: list[pd.DataFrame] = field(default_factory=list)
    first_leaked: dict[tuple[str, str], int] = field(default_factory=dict)  # value -> first step out
    first_exposed: dict[tuple[str, str], int] = field(default_factory=dict)
    should_stop: bool = False
    seconds: float = 0.0  # spent probing, all probes
    deferred: list[int] = field(default_factory=list)  # due steps put off to keep within max_overhead
    without_exposure: list[int] = field(default_factory=list)  # probed greedily alone, for the same

    def __post_init__(self) -> None:
        ids = list(self.example_ids) if self.example_ids is not None else list(range(len(self.texts)))
        keep = [i for i, t in enumerate(self.texts) if find_secrets(str(t))]  # only texts with a value
        self._texts = [str(self.texts[i]) for i in keep]
        self._ids = [int(ids[i]) for i in keep]
        self._tokens = [list(self.token_ids[i]) for i in keep]
        self._last: dict[str, float] = {}
        self._started: float | None = None  # the first step() call: training time is counted from it
        self._last_cost = 0.0  # the last probe's seconds without exposure
        self._greedy_seconds = 0.0  # all of those
        self._exposure_cost: float | None = None  # the last probe's seconds with it

    @property
    def values(self) -> int:
        """How many texts hold a value to probe."""
        return len(self._texts)

    def step(self, model: Any, step: int) -> dict[str, float] | None:
        """Probe when ``step`` is a multiple of ``every`` and the probes stay within
        ``max_overhead`` of the training time so far; the step's numbers, else None."""
        now = time.perf_counter()
        if self._started is None:
            self._started = now
        if step % self.settings.every or not self._texts:
            return None
        limit = self.settings.max_overhead
        budget = math.inf if limit is None else limit * ((now - self._started) - self.seconds)
        # the greedy continuation (the leak detector, cheap) is held to the bound on its own, so a
        # costly exposure never stops it; exposure takes what the whole bound leaves
        if self._greedy_seconds + self._last_cost > budget:
            self.deferred.append(step)
            return None
        if self.settings.n_candidates > 1 and self._exposure_cost is None and limit is not None:
            # the first probe is greedy and forecasts exposure from one value: on SmolLM2 a probe's
            # exposure of 60 values took 457 CPU s against 148 s of training at step 50, so
            # measuring it whole first would spend the bound many times over before it is known
            got = self.probe(model, step, exposure=False)
            self._exposure_cost = self.forecast_exposure(model)
            self.without_exposure.append(step)
            return got
        # exposure (97% of a probe's cost on the benchmark) when its forecast fits
        exposure = self.settings.n_candidates > 1 and (
            limit is None or self.seconds + self._exposure_cost <= budget)
        if not exposure and self.settings.n_candidates > 1:
            self.without_exposure.append(step)
        return self.probe(model, step, exposure=exposure)

    def forecast_exposure(self, model: Any) -> float:
        """The seconds a probe with exposure would take: one distinct value's exposure timed under
        the current weights, times the measurements a probe makes (each distinct value with a
        space, and ``NULL_VALUES`` never-trained values per format), plus the greedy probe's cost.
        The timing counts among the probes' seconds."""
        from gnq_core.attacks.secret_attack import occurrences_of, secret_targets
        from gnq_core.attacks.secret_exposure import (
            NULL_VALUES,
            Measurer,
            Settings,
            first_occurrences,
            formats_of,
        )

        s = self.settings
        t0 = time.perf_counter()
        targets = secret_targets(s.tokenizer, self._texts, self._ids, self._tokens)
        first = first_occurrences(occurrences_of(targets, self._texts, self._ids))
        if not first:
            self.seconds += time.perf_counter() - t0
            return self._last_cost
        device = next(model.parameters()).device
        measurer = Measurer(s.tokenizer, Settings(s.n_candidates, s.search_nodes, s.seed, s.batch_size,
                                                  self.max_length, device))
        o, space = next(iter(first.values()))
        t1 = time.perf_counter()
        measurer.measure(model, o, space)
        one = time.perf_counter() - t1
        self.seconds += time.perf_counter() - t0
        return self._last_cost + one * (len(first) + len(formats_of(first)) * NULL_VALUES)

    def overhead(self) -> float:
        """The probes' seconds over the training's seconds since the first step (NaN before)."""
        if self._started is None:
            return float("nan")
        training = (time.perf_counter() - self._started) - self.seconds
        return self.seconds / training if training > 0 else float("nan")

    def probe(self, model: Any, step: int, exposure: bool = True) -> dict[str, float]:
        """Every value under the current weights, now (the attack restores the model's mode);
        ``exposure`` False: the greedy continuation alone."""
        s = self.settings
        t0 = time.perf_counter()
        device = next(model.parameters()).device
        attack = attack_secrets(model, s.tokenizer, self._texts, self._ids, self._tokens, reference=None,
                                n_candidates=s.n_candidates if exposure else 1, search_nodes=s.search_nodes,
                                seed=s.seed,
                                batch_size=s.batch_size, device=device, max_length=self.max_length,
                                rule=f"tracked at step {step}: no reference model, exposed = above the null")
        seconds = time.perf_counter() - t0
        self.seconds += seconds
        if exposure and s.n_candidates > 1:
            self._exposure_cost = seconds
        else:
            self._last_cost = seconds
            self._greedy_seconds += seconds
        rows = attack.rows
        frame = pd.DataFrame({
            "step": step, "example_id": rows["example_id"].astype(int), "kind": rows["kind"],
            "value": rows["value"], "chars": rows["chars"].astype(int),
            "chars_reproduced": rows["chars_reproduced"].astype(int),
            "leaked": rows["extracted"].astype(bool),
            "partly": [not bool(x) and partly_leaked(int(n), int(h), None, None if pd.isna(v) else int(v))
                       for x, n, h, v in zip(rows["extracted"], rows["chars"], rows["chars_reproduced"],
                                             rows["novel_chars_reproduced"], strict=True)],
            "exposure": rows["exposure"].astype("Float64"), "exposure_method": rows["exposure_method"],
            "null_p99": rows["exposure_null_p99"].astype("Float64"),
            "exposed": rows["exposed"].astype("boolean"), "seconds": seconds}, columns=TRACK_COLUMNS)
        self.rows.append(frame)
        newly = []
        for r in frame.itertuples(index=False):
            key = (str(r.kind), str(r.value))
            if r.leaked and key not in self.first_leaked:
                self.first_leaked[key] = step
                newly.append((r, "comes out whole"))
            if bool(pd.notna(r.exposed) and r.exposed) and key not in self.first_exposed:
                self.first_exposed[key] = step
                if s.act_on_exposed and not r.leaked:
                    newly.append((r, f"crosses the null's threshold ({r.exposure:.1f} bits, never-trained "
                                     f"99th percentile {r.null_p99:.1f})"))
        for r, what in newly:  # the kind and the text, never the value
            print(f"GNQ: step {step}: the {r.kind} of text {r.example_id} {what} under the current weights",
                  file=sys.stderr)
        if newly and s.on_leak == "stop":
            self.should_stop = True
        exposure = frame["exposure"].dropna()
        self._last = {"secrets/probed": float(len(frame)), "secrets/leaked": float(frame["leaked"].sum()),
                      "secrets/partly": float(sum(frame["partly"])),
                      "secrets/exposed": float(frame["exposed"].fillna(False).sum()),
                      "secrets/max_exposure": float(exposure.max()) if len(exposure) else float("nan"),
                      "secrets/seconds": seconds, "secrets/overhead": self.overhead()}
        return dict(self._last)

    def summaries(self) -> dict[str, float]:
        """The last probe's numbers, once (for the next training log)."""
        out, self._last = self._last, {}
        return out

    def history(self) -> pd.DataFrame:
        """Every probe's rows (``TRACK_COLUMNS``), in step order."""
        return (pd.concat(self.rows, ignore_index=True) if self.rows
                else pd.DataFrame(columns=TRACK_COLUMNS))

    def write(self, folder: str | Path) -> Path:
        """The history as ``secret_tracking.parquet`` in ``folder`` (replaced atomically)."""
        from gnq_core.common.atomic import atomic_path

        path = Path(folder) / TRACKING_FILE
        with atomic_path(path) as tmp:
            self.history().to_parquet(tmp, index=False)
        return path


class SecretTrackingCallback(TrainerCallback):
    """A ``SecretTracker`` driven by a Trainer: probes at every ``every``-th optimizer step, stops
    training there when asked, and writes the history beside the shards (rank 0 only)."""

    def __init__(self, settings: SecretTracking, trainer: Any, texts: Sequence[str] | None,
                 out: str | Path, max_length: int | None = None) -> None:
        self.settings, self.trainer, self.out = settings, trainer, out
        self.texts, self.max_length = settings.texts if settings.texts is not None else texts, max_length
        require(self.texts is not None, "SecretTracking: give the training texts (SecretTracking texts= or "
                                        "GNQConfig texts=): their values are what is probed")
        self.tracker: SecretTracker | None = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if args.process_index != 0:
            return
        ds = self.trainer.train_dataset
        rows = [ds[i] for i in range(len(ds))]
        ids = [int(r["example_id"]) for r in rows]
        texts = [self.texts[e] for e in ids]
        length = self.max_length or max(len(r["input_ids"]) for r in rows)
        self.tracker = SecretTracker(self.settings, texts, [list(r["input_ids"]) for r in rows], ids,
                                     max_length=length)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.tracker is None:
            return
        if self.tracker.step(model, state.global_step) is not None:
            self.tracker.write(self.out)  # after each probe: there for gnq ingest at the end of training
        if self.tracker.should_stop:
            control.should_training_stop = True

    def summaries(self) -> dict[str, float]:
        return self.tracker.summaries() if self.tracker is not None else {}


def check_tracking(value: object) -> None:
    """GNQConfig's ``track_secrets``: a SecretTracking or None."""
    require(value is None or isinstance(value, SecretTracking),
            f"GNQConfig track_secrets must be a SecretTracking or None, got {type(value).__name__}")
    if isinstance(value, SecretTracking):
        finite(value.every, "SecretTracking every", 1)
