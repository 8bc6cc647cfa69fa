"""A run's exposures (``attacks.exposure``): one per distinct secret value, under the audited
and the reference model, and the run's null, which decides which values are *exposed*.

* One number per distinct value (kind and value): its copies share one computation, made after
  the prompt of its first occurrence (lowest text id, then position), and the count of its
  occurrences stands beside it.  Its random candidates are seeded by the run's seed and the
  value, never by the text.
* The null: for every format (kind and template), ``NULL_VALUES`` values that no text of the run
  holds, drawn uniformly in the same template, each scored the same way after the prompt of one
  of the format's values in turn.  Under an exact rank a never-trained value's rank is uniform
  over its space, so its exposure exceeds t bits with probability 2^−t (median 1 bit); the
  null shows what the method gives such values in this run, estimates included.
* ``exposed`` (attacks/exposure_fdr.py): the value's p-value (2^−exposure for an exact rank)
  survives Benjamini–Hochberg at the run's q across all its values and, with a reference model,
  its likelihood ratio audited/reference beats that of never-trained values of its format (a
  likelihood-ratio test, not two exposures compared).  The null's 99th percentile is kept beside
  it as the control's spread, no longer a threshold.
* Kinds with no uniform space (e-mails, names, addresses, dates of birth; catalog: exposure
  RELATIVE), with a reference model: exposure relative to the reference
  (attacks/exposure_relative.py: the share of the values the reference would write whose
  likelihood ratio audited/reference is at least the value's); their null is never-trained
  values of the kind (surrogates of the run's values, never a value of the data) measured the
  same way, and the same likelihood-ratio test and Benjamini–Hochberg decide "exposed".  Without a
  reference they get no exposure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gnq_core.attacks.exposure import (
    Exposure,
    Scorers,
    ValueSpace,
    exposure,
    score_values,
    value_seed,
    value_space,
)
from gnq_core.attacks.exposure_fdr import FDR_Q, RATIO_VALUES, decide, rank_p, ratio_p
from gnq_core.attacks.exposure_relative import MIN_VALUE_CHARS, Relative, measure_kind
from gnq_core.attacks.forward import evaluating
from gnq_core.catalog import RELATIVE, RELATIVE_TEMPLATE
from gnq_core.catalog import kind as catalog_kind
from gnq_core.common.progress import SECRET_VALUES
from gnq_core.results.store_writes import SECRET_NULL_COLUMNS as NULL_COLUMNS
from gnq_core.sources.surrogates import SurrogateError, surrogate

NULL_VALUES = 20       # never-trained values per format
NULL_QUANTILE = 0.99   # "exposed" lies above this quantile of the null


@dataclass(frozen=True)
class Occurrence:
    """One place a value appears: the prompt before it and the text between prompt and value."""

    example_id: int
    start: int
    kind: str
    value: str
    prompt: tuple[int, ...]
    between: str
    fixed: frozenset[int]  # indices of its letters and digits the run's format explains


@dataclass(frozen=True)
class Settings:
    n_candidates: int
    budget: int
    seed: int
    batch_size: int
    max_length: int
    device: object = None
    fdr_q: float = FDR_Q  # the false-discovery rate "exposed" is controlled at


Distinct = dict[tuple[str, str], tuple[Occurrence, ValueSpace]]


def first_occurrences(occurrences: Sequence[Occurrence]) -> Distinct:
    """Per distinct (kind, value) with an exposure space: its first occurrence (lowest text id,
    then position), where its one exposure is computed, and its space."""
    first: Distinct = {}
    for o in sorted(occurrences, key=lambda o: (o.example_id, o.start)):
        key = (o.kind, o.value)
        if key not in first and (space := value_space(o.value, o.kind, set(o.fixed))) is not None:
            first[key] = (o, space)
    return first


def formats_of(first: Distinct) -> dict[tuple[str, str], list[tuple[Occurrence, ValueSpace]]]:
    """The distinct values of each format (kind, template): each format gets ``NULL_VALUES``
    never-trained values, measured after its values' prompts in turn."""
    formats: dict[tuple[str, str], list[tuple[Occurrence, ValueSpace]]] = {}
    for o, space in first.values():
        formats.setdefault((o.kind, space.template), []).append((o, space))
    return formats


class Measurer:
    """One exposure of a value after an occurrence's prompt, as the run measures it: the prompt cut
    to leave room for the value within ``max_length``, the candidates seeded per format, and the
    prompt's scorer (its cache and the rows its searches computed) kept for every later value
    after the same prompt under the same model (``exposure.Scorers``)."""

    def __init__(self, tokenizer, settings: Settings) -> None:
        self.tokenizer, self.settings = tokenizer, settings
        self.scorers = Scorers(settings.batch_size, settings.device)

    def prompt_of(self, o: Occurrence, space: ValueSpace) -> list[int]:
        return prompt_of_value(dataclasses.replace(o, value=space.value), self.settings.max_length)

    def measure(self, model, o: Occurrence, space: ValueSpace) -> Exposure:
        s, prompt = self.settings, self.prompt_of(o, space)
        with evaluating(model):
            return exposure(model, self.tokenizer, prompt, o.between, space, budget=s.budget,
                            n_candidates=s.n_candidates,
                            seed=value_seed(s.seed, o.kind, space.template),  # one sample a format
                            batch_size=s.batch_size, device=s.device, scorer=self.scorers(model, prompt))


def run_exposures(model, reference, tokenizer, occurrences: Sequence[Occurrence],
                  values_by_kind: dict[str, set[str]], settings: Settings,
                  progress: Callable[[str, int, str], None] | None = None,
                  advance: Callable[[int], None] | None = None
                  ) -> tuple[dict[tuple[str, str], dict], pd.DataFrame]:
    """(columns per (kind, value), the null's rows ``NULL_COLUMNS``)."""
    copies = Counter((o.kind, o.value) for o in occurrences)
    first = first_occurrences(occurrences)
    formats = formats_of(first)
    relative = relative_kinds(occurrences) if reference is not None else {}
    models = 2 if reference is not None else 1
    if progress is not None:
        n_relative = sum(len(members) for members in relative.values())
        progress(f"secret-like values: exact rank or estimate of {len(first) + n_relative} distinct values, "
                 f"and the null ({NULL_VALUES} never-trained values per format)",
                 len(first) * models + len(formats) * NULL_VALUES + n_relative + len(relative) * NULL_VALUES,
                 SECRET_VALUES)

    measurer = Measurer(tokenizer, settings)  # a prompt's cache and rows, kept for the run
    scorers, prompt_of = measurer.scorers, measurer.prompt_of

    def measure(m, o: Occurrence, space: ValueSpace) -> Exposure:
        got = measurer.measure(m, o, space)
        if advance is not None:
            advance(1)
        return got

    audited = {key: measure(model, o, space) for key, (o, space) in first.items()}
    referenced = ({key: measure(reference, o, space) for key, (o, space) in first.items()}
                  if reference is not None else {})
    def ratios(o: Occurrence, space: ValueSpace, values: Sequence[str]) -> np.ndarray:
        """log-likelihood audited − reference of ``values`` after ``o``'s prompt (batched, kept)."""
        prompt = prompt_of(o, space)
        with evaluating(model), evaluating(reference):
            return (score_values(scorers(model, prompt), tokenizer, o.between, values)
                    - score_values(scorers(reference, prompt), tokenizer, o.between, values))

    null_rows, thresholds, ratio_null = [], {}, {}
    for (kind, template), members in formats.items():
        # the first NULL_VALUES are ranked (the null); all of them, scored, are the reference test's null
        drawn = null_values(members[0][1], values_by_kind.get(kind, set()),
                            random.Random(value_seed(settings.seed, "null", kind, template)),
                            RATIO_VALUES if reference is not None else NULL_VALUES)
        ranked = drawn[:NULL_VALUES]
        bits, log_ratio = [], {}
        if reference is not None:
            for j, (o, space) in enumerate(members):
                mine = drawn[j::len(members)]  # drawn[i] is measured after members[i % len(members)]'s prompt
                log_ratio |= dict(zip(mine, ratios(o, space, mine).tolist(), strict=True)) if mine else {}
            ratio_null[(kind, template)] = list(log_ratio.values())
        with evaluating(model):  # each prompt's never-trained values scored in batches, not one by one
            for j, (o, space) in enumerate(members):
                mine = ranked[j::len(members)]  # the values measured after this member's prompt below
                score_values(scorers(model, prompt_of(o, space)), tokenizer, o.between, mine)
        for i, v in enumerate(ranked):
            o, space = members[i % len(members)]
            e = measure(model, o, dataclasses.replace(space, value=v))
            null_rows.append({"kind": kind, "template": template, "value": v,
                              "prompt_example_id": o.example_id, **_columns(e),
                              "log_ratio": log_ratio.get(v)})
            if e.bits is not None:
                bits.append(e.bits)
        thresholds[(kind, template)] = null_threshold(bits)
    relatives, relative_rows = {}, {}
    if relative:
        with evaluating(model), evaluating(reference):
            relatives, relative_rows = measure_relative(model, reference, tokenizer, relative, values_by_kind,
                                                        settings, scorers)
    for kind in relative:
        rows = relative_rows[kind]
        ratio_null[(kind, RELATIVE_TEMPLATE)] = [r["log_ratio"] for r in rows]
        null_rows += rows[:NULL_VALUES]
        thresholds[(kind, RELATIVE_TEMPLATE)] = null_threshold([r["exposure"] for r in rows[:NULL_VALUES]
                                                                if r["exposure"] is not None])
        if advance is not None:
            advance(len(relative[kind]) + NULL_VALUES)
    keys = list(first) + list(relatives)
    p_values = [_p(audited[k], first[k][1]) for k in first] + [r.exposure.p_value for r in relatives.values()]
    value_ratio = ({k: float(ratios(o, space, [space.value])[0]) for k, (o, space) in first.items()}
                   if reference is not None else {})
    value_ratio |= {k: r.log_ratio for k, r in relatives.items()}
    templates = {k: space.template for k, (_, space) in first.items()}
    templates |= dict.fromkeys(relatives, RELATIVE_TEMPLATE)
    reference_p = ([ratio_p(value_ratio[k], ratio_null[(k[0], templates[k])]) for k in keys]
                   if reference is not None else None)
    exposed_of = dict(zip(keys, decide(p_values, reference_p, settings.fdr_q), strict=True))
    out = {}
    for i, (key, (o, space)) in enumerate(first.items()):
        e, ref = audited[key], referenced.get(key)
        p99 = thresholds[(o.kind, space.template)]
        out[key] = {**_columns(e), "exposure_template": space.template, "exposure_space_bits": space.bits,
                    "value_copies": copies[key], "exposure_null_p99": p99, "exposed": exposed_of[key],
                    "reference_exposure": ref.bits if ref else None,
                    "reference_exposure_method": ref.method if ref else None,
                    "reference_exposure_rank": ref.rank if ref else None,
                    "exposure_p": p_values[i], "log_ratio": value_ratio.get(key),
                    "reference_ratio_p": reference_p[i] if reference_p is not None else None,
                    "exposure_fdr_q": settings.fdr_q}
    for i, (key, r) in enumerate(relatives.items(), start=len(first)):
        out[key] = {**_columns(r.exposure), "exposure_template": RELATIVE_TEMPLATE,
                    "exposure_space_bits": None, "value_copies": copies[key],
                    "exposure_null_p99": thresholds[(key[0], RELATIVE_TEMPLATE)],
                    "exposed": exposed_of[key], "reference_exposure": None, "reference_exposure_method": None,
                    "reference_exposure_rank": None, "exposure_p": p_values[i], "log_ratio": r.log_ratio,
                    "reference_ratio_p": reference_p[i], "exposure_fdr_q": settings.fdr_q}
    return out, pd.DataFrame(null_rows, columns=NULL_COLUMNS)


def measure_relative(model, reference, tokenizer, relative: dict[str, list[Occurrence]],
                     values_by_kind: dict[str, set[str]], settings: Settings, scorers
                     ) -> tuple[dict[tuple[str, str], Relative], dict[str, list[dict]]]:
    """Per distinct value of the kinds measured relative to the reference (``relative_kinds``) its
    ``Relative``, and per kind its ``RATIO_VALUES`` never-trained values as null rows (the first
    ``NULL_VALUES`` are the null shown; all are the likelihood-ratio test's): surrogates of the
    kind's values in turn (the i-th after value i mod len's prompt), never a value of the data."""
    relatives: dict[tuple[str, str], Relative] = {}
    rows: dict[str, list[dict]] = {}
    for kind, members in relative.items():
        rng = random.Random(value_seed(settings.seed, "null", kind, RELATIVE_TEMPLATE))
        taken = values_by_kind.get(kind, set()) | {o.value for o in members}
        order: list[tuple[int, str]] = []  # (member, never-trained value), in the null's order
        for i in range(RATIO_VALUES):
            with contextlib.suppress(SurrogateError):  # a value too short to redraw: one fewer
                order.append((i % len(members), surrogate(kind, members[i % len(members)].value, rng, taken)))
        never = [[v for m, v in order if m == j] for j in range(len(members))]
        got, null = measure_kind(model, reference, tokenizer, members,
                                 [prompt_of_value(o, settings.max_length) for o in members], scorers,
                                 settings.n_candidates, never,
                                 lambda i, ms=members: value_seed(settings.seed, "relative", ms[i].kind,
                                                                  ms[i].value))
        relatives |= {(o.kind, o.value): r for o, r in zip(members, got, strict=True)}
        measured = {(i, v): r for i, v, r in null}
        rows[kind] = [{"kind": kind, "template": RELATIVE_TEMPLATE, "value": v,
                       "prompt_example_id": members[i].example_id, **_columns(measured[(i, v)].exposure),
                       "log_ratio": measured[(i, v)].log_ratio} for i, v in order if (i, v) in measured]
    return relatives, rows


def relative_kinds(occurrences: Sequence[Occurrence]) -> dict[str, list[Occurrence]]:
    """Per kind whose values have no uniform space (catalog: exposure RELATIVE), its distinct
    values' first occurrences (lowest text id, then position), measured relative to the reference
    (attacks/exposure_relative.py)."""
    out: dict[str, list[Occurrence]] = {}
    seen: set[tuple[str, str]] = set()
    for o in sorted(occurrences, key=lambda o: (o.example_id, o.start)):
        if (o.kind, o.value) in seen or catalog_kind(o.kind).exposure != RELATIVE:
            continue
        if len(o.value.strip()) >= MIN_VALUE_CHARS:
            seen.add((o.kind, o.value))
            out.setdefault(o.kind, []).append(o)
    return out


def prompt_of_value(o: Occurrence, max_length: int) -> list[int]:
    """The occurrence's prompt cut to leave room for the text between it and the value, and the
    value, within ``max_length`` (as ``Measurer.prompt_of``)."""
    return list(o.prompt[-max(1, max_length - len(o.between + o.value)):])


def null_threshold(bits: Sequence[float]) -> float | None:
    """The null's 99th percentile: its sample quantile, or log2 100 = 6.6 bits (that of a
    never-trained value's exposure under an exact rank, uniform over its space) when higher,
    because 20 values cannot place a 99th percentile (their quantile sits near their maximum,
    which a uniform rank exceeds 5 % of the time).  None without a measured null value."""
    if not len(bits):
        return None
    return max(float(np.quantile(bits, NULL_QUANTILE)), -math.log2(1.0 - NULL_QUANTILE))


def _p(e: Exposure, space: ValueSpace) -> float | None:
    """The value's p-value: its estimate's own (an upper bound) where estimated, else 2^−exposure."""
    if e.bits is None:
        return None
    return e.p_value if e.p_value is not None else rank_p(e.bits, space.bits)


def _columns(e: Exposure) -> dict:
    return {"exposure": e.bits, "exposure_method": e.method, "exposure_rank": e.rank,
            "exposure_nodes": e.nodes, "exposure_candidates": e.candidates, "exposure_fit": e.fit}


def null_values(space: ValueSpace, taken: set[str], rng: random.Random,
                count: int = NULL_VALUES) -> list[str]:
    """Up to ``count`` distinct values of ``space`` that the run does not hold (the first
    ``NULL_VALUES`` are the same whatever ``count``: one seeded sequence)."""
    out: list[str] = []
    room = space.size - sum(1 for v in taken if space.allows(v))
    for _ in range(100 * count):
        if len(out) >= min(count, room):
            break
        v = space.random(rng)
        if v not in taken and v not in out:
            out.append(v)
    return out
