"""How long a job will take, measured on the user's own model and machine before it starts.

A short probe loads the first checkpoint as the audit loads it (with the job's own settings and
threads, after the audit's memory plan) and hands each stage of the jobs it forecasts the model
and a sample of the texts: the audit's stages (pipelines/audit_stage.py) and the attack's
(``Attack.stages`` of the attacks ``gnq extract`` would run, attacks/stored.py).  Each stage
counts its work with its own code and times a few units of it (attacks/stage_cost.py); its line
is then its measured unit cost × its work count, ``Line.assumed`` saying what it takes for
granted.  No stage's logic is here: a stage added to a job kind is counted, timed and shown.
Pipelines/estimate.py's fixed line is the fallback before a probe has run.

``STAGE_LABELS`` ties each line to the progress stages the job reports (``Reporter.stage``
labels, each stage's ``label``), so a test can check that every stage a job runs has its line.
"""

from __future__ import annotations

import contextlib
import functools
import random
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from gnq_core.attacks.defaults import (
    DEFAULT_ATTACK_BATCH,
    DEFAULT_EXPOSURE_NODES,
    DEFAULT_PREFIX,
    DEFAULT_SECRET_CANDIDATES,
    DEFAULT_SUFFIX,
    DEFAULT_THRESHOLD,
)
from gnq_core.attacks.stage_cost import WARM_UP_S, Line, Probe, ProbeRun, Work, split_named

__all__ = ["Line", "Probe", "Work", "describe", "estimate_lines", "job_kinds", "job_stages",
           "measure_estimate", "stage_of", "total_seconds"]

SAMPLE_TEXTS = 2_000  # texts tokenised to count the work; more are sampled (seeded) and scaled


def job_kinds(work: Work) -> list[tuple[str, list]]:
    """(job kind, its stages in the order they run) of the jobs ``work`` describes: the audit's,
    then (with ``work.attack``) those of the attacks ``gnq extract`` runs with its settings."""
    from gnq_core.attacks.stored import stored_attacks
    from gnq_core.pipelines.audit_stage import audit_stages

    kinds = [("audit", audit_stages())]
    if work.attack:
        attacks = stored_attacks(work.prefix, DEFAULT_THRESHOLD, work.suffix, work.reference,
                                 work.secret_candidates, work.exposure_nodes)
        kinds.append(("extract", [stage for attack in attacks for stage in attack.stages]))
    return kinds


def job_stages(work: Work) -> list:
    """Every stage of the jobs ``work`` describes, in order (``job_kinds``)."""
    return [stage for _, stages in job_kinds(work) for stage in stages]


@functools.cache
def _stage_labels() -> dict[str, re.Pattern[str]]:
    every = Work(texts=0, checkpoints=2, batch_size=1)  # every stage: calibrated, a suffix, candidates
    return {s.key: s.label for s in job_stages(every) if s.label is not None}


def __getattr__(name: str) -> Any:
    if name == "STAGE_LABELS":  # read from the stages when asked (importing the attacks imports torch)
        return _stage_labels()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def stage_of(label: str) -> str:
    """The estimate line ("audit", "attack", ...) that covers a progress stage's label: the stage
    whose ``label`` matches, else the audit's (a checkpoint's stage is labelled by the checkpoint)."""
    return next((key for key, pattern in _stage_labels().items() if pattern.search(label)), "audit")


def estimate_lines(work: Work, probe: Probe) -> list[Line]:
    """One line per stage the job runs (the attack's only with ``work.attack``)."""
    return [line for stage in job_stages(work) if (line := stage.line(work, probe)) is not None]


def total_seconds(lines: Sequence[Line]) -> float:
    return sum(line.seconds for line in lines)


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _Clock:
    """The stages' timer (attacks.stage_cost.Clock): wall seconds once the device's queued work is
    done, so a GPU's work is measured (nothing to wait for on the CPU)."""

    def __init__(self, device) -> None:
        import torch

        self.cuda = device is not None and torch.device(device).type == "cuda"
        self.device = device

    def now(self) -> float:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def timed(self, fn: Callable[[], Any]) -> float:
        """Seconds of ``fn()``; run again when the first was quick (the first call pays one-time
        costs: allocations, kernel choices) and the second kept."""
        for _ in range(2):
            t0 = self.now()
            fn()
            seconds = self.now() - t0
            if seconds > WARM_UP_S:
                break
        return seconds


def measure_estimate(checkpoint: str, dataset, *, batch_size: int | None, max_length: int, seed: int = 0,
                     threads: int = 1, attack: bool = True, reference: bool = True,
                     prefix: int = DEFAULT_PREFIX, suffix: int | None = DEFAULT_SUFFIX,
                     attack_batch: int = DEFAULT_ATTACK_BATCH,
                     secret_candidates: int = DEFAULT_SECRET_CANDIDATES,
                     exposure_nodes: int = DEFAULT_EXPOSURE_NODES, checkpoints: int = 1, lam: float = 1e-3,
                     tokenizer: str | None = None, device: str = "auto", adapters=None, dtype: str = "auto",
                     ) -> tuple[Work, Probe]:
    """Count the job's work in ``dataset`` (a TextDataset, its secret patterns set) and time its
    stages' unit costs on ``checkpoint`` at ``threads`` torch threads on ``device`` (the job's:
    "auto" is a GPU where there is one) (module docstring).  ``adapters``
    (sources.adapters.Adapters): the checkpoint is a PEFT adapter of that base, loaded and audited
    as ``gnq audit --base-model`` does (GNQ over the adapter's parameters unless merged).  The
    checkpoint is loaded as the audit loads it (in ``dtype``; "auto": as stored), after the
    audit's memory plan (``sources.memory_plan``, of the base for adapters): a plan that does not
    fit is refused as the audit would refuse it, before loading; ``batch_size`` None: the plan's."""
    from gnq_core.common.runtime import resolve_device, resolve_dtype
    from gnq_core.pipelines.audit import load_audited
    from gnq_core.pipelines.audit_stage import AuditProbe
    from gnq_core.pipelines.settings import AuditSettings
    from gnq_core.sources.memory_plan import check_plan, model_shape, plan_audit
    from gnq_core.sources.tokens import encode_texts

    dev = resolve_device(device)
    model_path = str(adapters.base) if adapters is not None else checkpoint  # an adapter's shape: its base's
    if dtype == "auto":
        dtype = model_shape(model_path).stored_dtype or "float32"
    adapter = checkpoint if adapters is not None and not adapters.merged else None  # as the audit plans it
    plan, _ = check_plan(model_path, batch_size=batch_size, max_length=max_length, dtype=dtype,
                         checkpoints=checkpoints, device=str(dev), adapter=adapter)
    window = prefix + (suffix or DEFAULT_SUFFIX)
    attack_plan = (plan_audit(model_path, batch_size=attack_batch, max_length=window, dtype=dtype,
                              checkpoints=1, device=str(dev), reference=reference) if attack else None)
    n = len(dataset)
    sub = _sample(dataset, seed)
    scale = n / max(1, len(sub))
    work = Work(texts=n, checkpoints=checkpoints, batch_size=plan.batch_size, attack=attack,
                reference=reference, suffix=suffix, attack_batch=attack_batch,
                secret_candidates=secret_candidates, prefix=prefix, exposure_nodes=exposure_nodes)
    clock = _Clock(dev)
    with _threads(threads):
        t0 = time.perf_counter()
        base_tokenizer = str(adapters.base) if adapters is not None else None  # an adapter's: its base's
        model, tok = load_audited(checkpoint, adapters, device=dev, dtype=resolve_dtype(dtype),
                                  tokenizer=tokenizer or base_tokenizer)
        load_s = time.perf_counter() - t0
        ids = encode_texts(tok, sub.texts, max_length)
        settings = AuditSettings(lam=lam, batch_size=plan.batch_size, max_length=max_length, seed=seed,
                                 dtype=dtype)
        audit_inputs = AuditProbe(model, tok, sub, settings, dev, checkpoints,
                                  trainable_only=adapters is not None and not adapters.merged)
        target = _attack_target(model, tok, sub, ids, dev, attack_batch, seed, max_length, prefix, suffix) \
            if attack else None
        inputs_of = {"audit": audit_inputs, "extract": target}  # what each job kind's stages run on
        stages = [(s, inputs_of[kind]) for kind, kind_stages in job_kinds(work) for s in kind_stages]
        counts = {k: v for stage, inputs in stages for k, v in stage.count(inputs, scale).items()}
        costs = {k: v for stage, inputs in stages for k, v in stage.measure(inputs, clock).items()}
    named, extra = split_named(counts, Work)
    work = replace(work, **named, counts=extra, mean_tokens=sum(map(len, ids)) / max(1, len(ids)))
    what = (f"{checkpoint} on {dev} at {threads} thread(s), {len(sub):,} of {n:,} texts counted"
            + (" (a seeded sample, scaled)" if len(sub) < n else ""))
    named, extra = split_named(costs, Probe)
    unmeasured = {"audit_batch_s": 0.0, "decode_s": 0.0, "forward_s": 0.0, "exposure_s": None}  # no stage
    probe = Probe(**(unmeasured | named), load_s=load_s, threads=threads, model=what, memory=plan,
                  attack_memory=attack_plan, units=extra)
    return work, probe


def _sample(dataset, seed: int):
    """The texts the probe counts on: all of them, or a seeded sample of ``SAMPLE_TEXTS`` (every
    per-text column cut with them)."""
    n = len(dataset)
    if n <= SAMPLE_TEXTS:
        return dataset
    picked = sorted(random.Random(seed).sample(range(n), SAMPLE_TEXTS))
    cut = {"texts": [dataset.texts[i] for i in picked], "groups": [dataset.groups[i] for i in picked]}
    for column in ("secret_values", "public", "layouts", "contents"):
        values = getattr(dataset, column, None)
        if values:  # None, or a chat dataset's empty default
            cut[column] = [values[i] for i in picked]
    return replace(dataset, **cut)


def _attack_target(model, tokenizer, dataset, ids, device, batch_size: int, seed: int, max_length: int,
                   prefix: int, suffix: int | None):
    """The probe's texts as ``run_extraction`` hands them to the attacks (attacks.contract.Target):
    their labels as the audit stores them, their windows, one model (the reference does the same
    work, counted by each stage's line), nothing stored."""
    import pandas as pd

    from gnq_core.attacks.contract import Target
    from gnq_core.attacks.windows import content_windows
    from gnq_core.common.progress import Reporter
    from gnq_core.sources.chat import ChatDataset
    from gnq_core.sources.text_labels import dataset_labels

    examples = pd.DataFrame({"example_id": range(len(dataset)), "text": dataset.texts})
    layouts = [lay.to_json() for lay in dataset.layouts] if isinstance(dataset, ChatDataset) else None
    examples = pd.concat([examples, dataset_labels(dataset)], axis=1)
    windows = content_windows(tokenizer, dataset.texts, layouts, ids, prefix, suffix or 1)
    return Target(None, ProbeRun(seed, max_length), 0, "probe", model, tokenizer, examples, ids, device,
                  batch_size, "", Reporter(), windows=windows)


def describe(lines: Sequence[Line], probe: Probe) -> str:
    """The estimate as lines of text: the total, then each stage with its count and assumption."""
    from gnq_core.pipelines.estimate import duration

    out = [f"Estimated time: about {duration(total_seconds(lines))} (measured on {probe.model}; a machine "
           "busier than during the probe is slower)"]
    out += [f"  {line.what}: {duration(line.seconds)} for {line.count:,} {line.noun} — {line.assumed}"
            for line in lines]
    if probe.memory is not None:
        out.append(f"Audit {probe.memory.describe()}"
                   + ("" if probe.memory.prefetch else "; no prefetch of the next checkpoint"))
    if probe.attack_memory is not None:
        out.append(f"Attack {probe.attack_memory.describe()}")
    return "\n".join(out)
