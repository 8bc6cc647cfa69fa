"""How long a job will take, measured on the user's own model and machine before it starts.

A short probe runs each kind of work the job does once, on the first checkpoint with the job's
own settings and threads: loading the checkpoint, the first real audit batches in one audit call
(``audit_batches``: the per-text gradients and the GNQ solve, of ``batch_size`` texts drawn as
the audit draws them; the first batch also pays the plan of the model, once per audit, and each
later checkpoint's first batch the check that the plan still holds), one
greedy decoding batch of the text attack, one scoring forward, and pairs of never-trained
secret values' exposures after one of their format's prompts: the first on a scorer of its own
(as each distinct value under each model), the second on the scorer the first used (as the null's
values, which share their format's prompts: the search's nodes already computed, the random
candidates not).
Each stage's time is then its measured unit cost × its work count, counted from the data
(texts, attackable texts, checkpoints, secret values, distinct values, formats); ``Line.assumed``
says what each line takes for granted.  Pipelines/estimate.py's fixed line is the fallback
before a probe has run.

``STAGE_LABELS`` ties each line to the progress stages the job reports (``Reporter.stage``
labels), so a test can check that every stage a job runs has its line.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import random
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gnq_core.attacks.defaults import (
    DEFAULT_ATTACK_BATCH,
    DEFAULT_EXPOSURE_NODES,
    DEFAULT_PREFIX,
    DEFAULT_SECRET_CANDIDATES,
    DEFAULT_SUFFIX,
)
from gnq_core.common.progress import SECRET_VALUES, TEXTS

SAMPLE_TEXTS = 2_000  # texts tokenised to count the work; more are sampled (seeded) and scaled
# Stage keys and the progress labels each covers (a checkpoint's audit is labelled by the
# checkpoint itself, so "audit" is every label not matched here).
STAGE_LABELS = {
    "attack": re.compile(r"^attack .* \(p=\d+\)$"),  # the reference decodes the same batches
    "membership": re.compile(r"^membership scores"),
    "discoverable": re.compile(r"^discoverable"),
    "secret decode": re.compile(r"^secret values decoded by the "),
    "exposure": re.compile(r"^secret-like values: exact rank or estimate"),
}


def stage_of(label: str) -> str:
    """The estimate line ("audit", "attack", ...) that covers a progress stage's label."""
    return next((key for key, pattern in STAGE_LABELS.items() if pattern.search(label)), "audit")


@dataclass(frozen=True)
class Work:
    """What the job will do, counted from its data and settings before it starts."""

    texts: int
    checkpoints: int
    batch_size: int
    attackable: int = 0  # texts of at least p + s tokens
    attack: bool = True
    reference: bool = True  # the attack calibrated: the reference model decodes and scores too
    suffix: int | None = DEFAULT_SUFFIX  # None: no discoverable pass
    attack_batch: int = DEFAULT_ATTACK_BATCH
    secret_values: int = 0  # attackable occurrences
    distinct_values: int = 0  # distinct values with an exposure space (copies share one)
    formats: int = 0  # (kind, template) pairs: each gets NULL_VALUES never-trained values
    secret_candidates: int = DEFAULT_SECRET_CANDIDATES
    mean_tokens: float = 0.0


@dataclass(frozen=True)
class Probe:
    """Unit costs measured on the model and machine, in seconds."""

    load_s: float  # one checkpoint loaded
    audit_batch_s: float  # one audit batch of Work.batch_size texts
    decode_s: float  # one attack batch of prompts greedy-decoded
    forward_s: float  # one attack batch of texts scored (a forward pass)
    exposure_s: float | None  # one of the run's values' exposure (None: no secret value to try)
    threads: int
    model: str  # what was measured, said in the basis
    audit_fixed_s: float = 0.0  # once per audit (its first batch's plan of the model), besides its batches
    # each later checkpoint's first batch: the kept plan checked (engine.plan.plan_reuse), besides its batches
    audit_reuse_s: float = 0.0
    # a later never-trained value after a prompt already searched (the null's values share the
    # prompt's scorer: attacks.exposure.Scorers); None: as ``exposure_s``
    exposure_shared_s: float | None = None
    # one secret value greedy-decoded by one model, from one batch of the run's own secret prompts
    # as the attack batches them (longer prompts than a text window's); None: as a text window's
    secret_decode_s: float | None = None
    # one attack batch of texts cut to p + s tokens scored (the discoverable pass); None: forward_s
    suffix_forward_s: float | None = None
    # the audit's memory plan (sources.memory_plan.MemoryPlan), and the attack's (the reference
    # model held besides); None: not planned
    memory: Any = None
    attack_memory: Any = None


@dataclass(frozen=True)
class Line:
    stage: str  # a STAGE_LABELS key or "audit"
    what: str
    count: int
    noun: str
    seconds: float
    assumed: str


def estimate_lines(work: Work, probe: Probe) -> list[Line]:
    """One line per stage the job runs (the attack's only with ``work.attack``)."""
    batches = math.ceil(work.texts / max(1, work.batch_size))
    later = max(0, work.checkpoints - 1)
    lines = [Line("audit", "gradient audit", work.texts * work.checkpoints, TEXTS,
                  work.checkpoints * (probe.load_s + batches * probe.audit_batch_s) + probe.audit_fixed_s
                  + later * probe.audit_reuse_s,
                  f"{work.checkpoints} checkpoint(s) × ({probe.load_s:.1f} s to load + {batches} batch(es) "
                  f"× {probe.audit_batch_s:.2f} s) + {probe.audit_fixed_s:.1f} s once to plan the model in "
                  f"the first batch + {later} later checkpoint(s) × {probe.audit_reuse_s:.1f} s to check "
                  "the plan still holds; measured on the first checkpoint's first batches")]
    if not work.attack:
        return lines
    per = max(1, work.attack_batch)
    decode = math.ceil(work.attackable / per) * probe.decode_s
    forward = math.ceil(work.texts / per) * probe.forward_s
    said = f"{math.ceil(work.attackable / per)} batch(es) of {per} × {probe.decode_s:.2f} s measured"
    models = 2 if work.reference else 1
    lines.append(Line("attack", "text windows, audited checkpoint" + (" and reference model" if work.reference
                                                                      else ""),
                      work.texts, TEXTS, models * (probe.load_s + decode),
                      f"{models} model(s) on the same batches × ({said}, + a load); texts under p + s tokens "
                      "are skipped at no cost"))
    if work.reference:
        lines.append(Line("membership", "membership scores (both models)", 2 * work.texts, TEXTS, 2 * forward,
                          f"2 × {math.ceil(work.texts / per)} forward(s) × {probe.forward_s:.2f} s measured"))
    if work.suffix is not None:
        if probe.suffix_forward_s is not None:  # only the texts of p + s tokens, cut there
            n_cut = math.ceil(work.attackable / per)
            lines.append(Line("discoverable", "discoverable likelihood", work.texts, TEXTS,
                              n_cut * probe.suffix_forward_s,
                              f"{n_cut} forward(s) of texts cut to p + s tokens × "
                              f"{probe.suffix_forward_s:.2f} s measured"))
        else:
            lines.append(Line("discoverable", "discoverable likelihood", work.texts, TEXTS, forward,
                              f"{math.ceil(work.texts / per)} forward(s) × {probe.forward_s:.2f} s measured "
                              "(at full length: an upper bound)"))
    if probe.secret_decode_s is not None:
        decode_values = work.secret_values * probe.secret_decode_s
        said = (f"{models} model(s) × {work.secret_values} value(s) × {probe.secret_decode_s:.3f} s each, "
                "measured on a batch of the run's own secret prompts")
    else:
        decode_values = math.ceil(work.secret_values / per) * probe.decode_s
        said = (f"{models} model(s) × {math.ceil(work.secret_values / per)} batch(es), each as a text "
                "window's decoding")
    lines.append(Line("secret decode", "secret values decoded", models * work.secret_values, SECRET_VALUES,
                      models * decode_values, said))
    if work.secret_candidates > 1:
        from gnq_core.attacks.secret_exposure import NULL_VALUES

        first = work.distinct_values * models
        each = probe.exposure_s or 0.0
        shared = probe.exposure_shared_s if probe.exposure_shared_s is not None else each
        null = work.formats * NULL_VALUES
        lines.append(Line("exposure", "secret values' exposure (with the null)", first + null, SECRET_VALUES,
                          first * each + null * shared,
                          f"{work.distinct_values} distinct value(s) × {models} model(s), each {each:.2f} s "
                          f"(the run's own values, after their prompts), + {work.formats} format(s) "
                          f"× {NULL_VALUES} never-trained values after their format's prompts, each "
                          f"{shared:.2f} s (the prompt's search already done); measured in turn per format "
                          "(a memorised value is ranked faster; a value whose search resumes to the full "
                          "node budget, slower)"))
    return lines


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


def _sync(device) -> None:
    """Wait for the GPU's queued work, so a timer measures it (nothing on the CPU)."""
    import torch

    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device=None) -> float:
    """Seconds of ``fn()``; run again when the first was quick (the first call pays one-time
    costs: allocations, kernel choices) and the second kept."""
    t0 = time.perf_counter()
    fn()
    _sync(device)
    first = time.perf_counter() - t0
    if first > 2.0:
        return first
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def measure_estimate(checkpoint: str, dataset, *, batch_size: int | None, max_length: int, seed: int = 0,
                     threads: int = 1, attack: bool = True, reference: bool = True,
                     prefix: int = DEFAULT_PREFIX, suffix: int | None = DEFAULT_SUFFIX,
                     attack_batch: int = DEFAULT_ATTACK_BATCH,
                     secret_candidates: int = DEFAULT_SECRET_CANDIDATES,
                     exposure_nodes: int = DEFAULT_EXPOSURE_NODES, checkpoints: int = 1, lam: float = 1e-3,
                     tokenizer: str | None = None, device: str = "auto", adapters=None, dtype: str = "auto",
                     ) -> tuple[Work, Probe]:
    """Count the job's work in ``dataset`` (a TextDataset, its secret patterns set) and time its
    unit costs on ``checkpoint`` at ``threads`` torch threads on ``device`` (the job's: "auto" is
    a GPU where there is one) (module docstring).  ``adapters`` (sources.adapters.Adapters): the
    checkpoint is a PEFT adapter of that base, loaded and audited as ``gnq audit --base-model``
    does (GNQ over the adapter's parameters unless merged).  The checkpoint is loaded as the audit
    loads it (in ``dtype``; "auto": as stored), after the audit's memory plan
    (``sources.memory_plan``, of the base for adapters): a plan that does not fit is refused as the
    audit would refuse it, before loading; ``batch_size`` None: the plan's."""
    import torch

    from gnq_core.attacks.decode import greedy_decode
    from gnq_core.attacks.exposure import value_space
    from gnq_core.attacks.forward import evaluating
    from gnq_core.attacks.secret_attack import format_places_of, secret_targets
    from gnq_core.common.runtime import resolve_device, resolve_dtype
    from gnq_core.engine.plan.plan_reuse import PlanCache
    from gnq_core.pipelines.audit import audit_batches, prepare_for_audit
    from gnq_core.results.text_labels import dataset_labels
    from gnq_core.sources.checkpoints.load import load_checkpoint
    from gnq_core.sources.memory_plan import check_plan, model_shape, plan_audit
    from gnq_core.sources.tokens import encode_texts, pad_id, seeded_partition, stream_batches

    dev = resolve_device(device)
    model_path = str(adapters.base) if adapters is not None else checkpoint  # an adapter's shape: its base's
    if dtype == "auto":
        dtype = model_shape(model_path).stored_dtype or "float32"
    plan, _ = check_plan(model_path, batch_size=batch_size, max_length=max_length, dtype=dtype,
                         checkpoints=checkpoints, device=str(dev))
    batch_size = plan.batch_size
    window = prefix + (suffix or DEFAULT_SUFFIX)
    attack_plan = (plan_audit(model_path, batch_size=attack_batch, max_length=window, dtype=dtype,
                              checkpoints=1, device=str(dev), reference=reference) if attack else None)
    n = len(dataset)
    picked = (sorted(random.Random(seed).sample(range(n), SAMPLE_TEXTS)) if n > SAMPLE_TEXTS
              else list(range(n)))
    scale = n / max(1, len(picked))
    texts = [dataset.texts[i] for i in picked]
    with _threads(threads):
        t0 = time.perf_counter()
        if adapters is not None:
            from gnq_core.sources.adapters import load_adapter_checkpoint

            model, tok = load_adapter_checkpoint(checkpoint, adapters, device=dev, dtype=resolve_dtype(dtype),
                                                 tokenizer=tokenizer or str(adapters.base))
        else:
            model, tok = load_checkpoint(checkpoint, device=dev, dtype=resolve_dtype(dtype),
                                         tokenizer=tokenizer)
        load_s = time.perf_counter() - t0
        ids = encode_texts(tok, texts, max_length)
        pad = pad_id(tok)
        sub = replace(dataset, texts=texts, groups=[dataset.groups[i] for i in picked],
                      secret_values=None if dataset.secret_values is None
                      else [dataset.secret_values[i] for i in picked],
                      public=None if dataset.public is None else [dataset.public[i] for i in picked])
        labels = dataset_labels(sub) if attack else None
        stored = ([v if isinstance(v, str) else None for v in labels["secret_values"]]
                  if labels is not None else [])
        targets = secret_targets(tok, texts, list(range(len(texts))), ids, stored) if attack else []
        by_kind: dict[str, set[str]] = {}
        for t in targets:
            by_kind.setdefault(t.kind, set()).add(t.value)
        places = {k: format_places_of(v) for k, v in by_kind.items()}
        spaces = {}
        for t in targets:
            fixed = t.fixed_by_pattern()
            space = value_space(t.value, t.kind, fixed if fixed is not None else places[t.kind][t.value])
            if space is not None:
                spaces.setdefault((t.kind, t.value), (t, space))
        formats = {(k, s.template) for (k, _), (_, s) in spaces.items()}

        # one audit batch, drawn as the audit draws its batches
        prepare_for_audit(model, resolve_dtype(dtype))
        partition = seeded_partition(len(texts), batch_size, seed)

        def audit(batches: list[int], plans: PlanCache) -> list[float]:
            """Seconds of each of ``batches`` in one audit call, as one checkpoint's audit runs them
            (one auditor: its first batch also pays its plan, or its check of ``plans``' plan); a
            batch is timed from the end of the one before, its tokenising included."""
            marks = [time.perf_counter()]

            def marked(stream: Iterator) -> Iterator:
                for k, batch in enumerate(stream):
                    if k:  # the audit asks for the next batch once it has finished this one
                        _sync(dev)
                        marks.append(time.perf_counter())
                    yield batch

            audit_batches(model, marked(stream_batches(tok, texts, partition, batches, max_length)), lam,
                          dev, None, indices=batches, capacity=batch_size * len(batches), plans=plans,
                          trainable_only=adapters is not None and not adapters.merged)
            _sync(dev)
            marks.append(time.perf_counter())
            return [b - a for a, b in itertools.pairwise(marks)]

        # The audit pays once, in its first batch, for the auditor's plan of the model
        # (engine.passes.first_batch: two more forwards, hooks off); each later checkpoint's first batch
        # checks that the kept plan still holds (engine.plan.plan_reuse: one forward) instead; the
        # batches after it are what each further batch costs.  So the first and the next batches
        # are timed in one call, as the audit runs them.  A quick first batch may hold the
        # process's one-time costs (kernel compilation, first allocations): then three are timed
        # again, planned anew.  Then, for a series, the first batch again on the kept plan.
        plans = PlanCache()
        times = audit(list(range(min(2, len(partition)))), plans)
        if times[0] < WARM_UP_S and len(partition) > 2:
            plans = PlanCache()
            times = audit([0, 1, 2], plans)
        audit_batch_s = sum(times[1:]) / len(times[1:]) if len(times) > 1 else times[0]
        audit_fixed_s = max(0.0, times[0] - audit_batch_s)
        audit_reuse_s = max(0.0, audit([0], plans)[0] - audit_batch_s) if checkpoints > 1 else 0.0
        decode_s = forward_s = 0.0
        exposure_s = shared_s = secret_decode_s = suffix_forward_s = None
        if attack:
            long_enough = [x for x in ids if len(x) >= prefix + (suffix or DEFAULT_SUFFIX)]
            prompts = [x[:prefix] for x in (long_enough or ids)[:attack_batch]] or [[pad]]
            with evaluating(model), torch.no_grad():
                decode_s = _timed(lambda: greedy_decode(model, prompts, suffix or DEFAULT_SUFFIX, pad, dev),
                                  dev)
                width = max(len(x) for x in ids[:attack_batch]) if ids else 1
                batch = torch.full((min(attack_batch, max(1, len(ids))), width), pad, device=dev)
                forward_s = _timed(lambda: model(input_ids=batch, attention_mask=torch.ones_like(batch)), dev)
                if suffix is not None:
                    cut = batch[:, : prefix + suffix]
                    suffix_forward_s = _timed(
                        lambda: model(input_ids=cut, attention_mask=torch.ones_like(cut)), dev)
            if targets:
                secret_decode_s = _secret_decode_seconds(model, targets, pad, attack_batch, dev)
            if spaces and secret_candidates > 1:
                exposure_s, shared_s = _exposure_seconds(
                    model, tok, texts, spaces, seed=seed, budget=exposure_nodes,
                    n_candidates=secret_candidates, batch_size=attack_batch, device=dev)
    attackable = sum(1 for x in ids if len(x) >= prefix + (suffix or 0))
    work = Work(texts=n, checkpoints=checkpoints, batch_size=batch_size, attackable=round(attackable * scale),
                attack=attack, reference=reference, suffix=suffix, attack_batch=attack_batch,
                secret_values=round(len(targets) * scale), distinct_values=round(len(spaces) * scale),
                formats=len(formats), secret_candidates=secret_candidates,
                mean_tokens=sum(map(len, ids)) / max(1, len(ids)))
    what = (f"{checkpoint} on {dev} at {threads} thread(s), {len(picked):,} of {n:,} texts counted"
            + (" (a seeded sample, scaled)" if len(picked) < n else ""))
    return work, Probe(load_s, audit_batch_s, decode_s, forward_s, exposure_s, threads, what,
                       audit_fixed_s=audit_fixed_s, audit_reuse_s=audit_reuse_s, exposure_shared_s=shared_s,
                       secret_decode_s=secret_decode_s, suffix_forward_s=suffix_forward_s,
                       memory=plan, attack_memory=attack_plan)


def _secret_decode_seconds(model, targets: Sequence, pad: int, batch_size: int, device) -> float:
    """Seconds to greedy-decode one secret value: the attack's first batch of them (its longest
    values, ``attacks.generation.plan_batches``) timed, and spread over every batch by its
    token-forwards (rows × (padded prompt + new tokens))."""
    from gnq_core.attacks.forward import evaluating
    from gnq_core.attacks.generation import generate, plan_batches

    prompts = [t.prompt_ids for t in targets]
    n_new = [len(t.target_ids) for t in targets]
    batches = plan_batches(prompts, n_new, batch_size)

    def work(b: list[int]) -> int:
        return len(b) * (max(len(prompts[i]) for i in b) + n_new[b[0]])

    first = batches[0]
    asked, wanted = [prompts[i] for i in first], [n_new[i] for i in first]
    with evaluating(model):
        seconds = _timed(lambda: generate([model], asked, wanted, pad, batch_size=batch_size, device=device),
                         device)
    return seconds * sum(map(work, batches)) / work(first) / len(targets)


EXPOSURE_VALUES = 16  # values timed at most, cycling over the formats (their mean is used)
EXPOSURE_PROBE_S = 10.0  # no further value is timed once the probe's exposures took this long
WARM_UP_S = 2.0  # a first call quicker than this is timed again (it paid one-time costs)


def _exposure_seconds(model, tok, texts: Sequence[str], spaces: dict, *, seed: int, budget: int,
                      n_candidates: int, batch_size: int, device=None) -> tuple[float, float]:
    """Mean seconds of one of the run's values' exposure after its own prompt, and of a
    never-trained value's after that prompt once its scorer has been used (as the null's values
    share their format's prompts, attacks.exposure.Scorers): pairs, a format's in turn, up to
    EXPOSURE_VALUES within EXPOSURE_PROBE_S (one pair at least; a first value quicker than
    WARM_UP_S is timed again), after the vocabulary's strings are built (once per tokenizer).  The
    run's own values, not never-trained ones, come first: a value the model has partly learned is
    searched deeper before its rank is known or estimated (several times a never-trained value's
    cost on a fine-tuned model), and a value's cost varies several-fold with how far its search
    goes, hence several."""
    from gnq_core.attacks.exposure import Scorers, ValueSpace, exposure, token_strings
    from gnq_core.attacks.forward import evaluating

    token_strings(tok)
    per_format: dict[str, list] = {}
    for t, space in spaces.values():
        per_format.setdefault(space.template, []).append((t, space))
    order = [members[i % len(members)] for i in range(EXPOSURE_VALUES) for members in per_format.values()]
    rng = random.Random(seed)

    def once(t, space, scorers, own: bool = False) -> float:
        drawn = (space.random(rng) for _ in range(100))
        value = space.value if own else next((v for v in drawn if v != space.value), space.value)
        t0 = time.perf_counter()
        exposure(model, tok, t.prompt_ids, texts[t.example_id][t.prompt_chars: t.value_start],
                 ValueSpace(value, space.free, space.check), budget=budget, n_candidates=n_candidates,
                 seed=seed, batch_size=batch_size, device=device, scorer=scorers(model, t.prompt_ids))
        _sync(device)
        return time.perf_counter() - t0

    fresh: list[float] = []
    shared: list[float] = []
    with evaluating(model):
        if once(*order[0], Scorers(batch_size, device)) >= WARM_UP_S:  # else timed again (one-time costs)
            order = order[1:] or order
        for t, space in order[: EXPOSURE_VALUES // 2]:
            if fresh and sum(fresh) + sum(shared) > EXPOSURE_PROBE_S:
                break
            scorers = Scorers(batch_size, device)
            fresh.append(once(t, space, scorers, own=True))
            shared.append(once(t, space, scorers))
    return sum(fresh) / len(fresh), sum(shared) / len(shared)


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
