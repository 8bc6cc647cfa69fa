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
* ``exposed``: above the null's 99th percentile (``null_threshold``) and above the reference
  model's exposure of the same value on the same space (without a reference model: above the
  null only).
"""

from __future__ import annotations

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
from gnq_core.attacks.forward import evaluating
from gnq_core.progress import SECRET_VALUES
from gnq_core.results.store_writes import SECRET_NULL_COLUMNS as NULL_COLUMNS

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


def run_exposures(model, reference, tokenizer, occurrences: Sequence[Occurrence],
                  values_by_kind: dict[str, set[str]], settings: Settings,
                  progress: Callable[[str, int, str], None] | None = None,
                  advance: Callable[[int], None] | None = None
                  ) -> tuple[dict[tuple[str, str], dict], pd.DataFrame]:
    """(columns per (kind, value), the null's rows ``NULL_COLUMNS``)."""
    copies = Counter((o.kind, o.value) for o in occurrences)
    first: dict[tuple[str, str], tuple[Occurrence, ValueSpace]] = {}
    for o in sorted(occurrences, key=lambda o: (o.example_id, o.start)):
        key = (o.kind, o.value)
        if key not in first and (space := value_space(o.value, o.kind, set(o.fixed))) is not None:
            first[key] = (o, space)
    formats: dict[tuple[str, str], list[tuple[Occurrence, ValueSpace]]] = {}
    for o, space in first.values():
        formats.setdefault((o.kind, space.template), []).append((o, space))
    models = 2 if reference is not None else 1
    if progress is not None:
        progress(f"secret-like values: exact rank or estimate of {len(first)} distinct values, and the null "
                 f"({NULL_VALUES} never-trained values per format)",
                 len(first) * models + len(formats) * NULL_VALUES, SECRET_VALUES)

    scorers = Scorers(settings.batch_size, settings.device)  # a prompt's cache and rows, kept for the run

    def prompt_of(o: Occurrence, space: ValueSpace) -> list[int]:
        return list(o.prompt[-max(1, settings.max_length - len(o.between + space.value)):])

    def measure(m, o: Occurrence, space: ValueSpace) -> Exposure:
        prompt = prompt_of(o, space)
        with evaluating(m):
            got = exposure(m, tokenizer, prompt, o.between, space, budget=settings.budget,
                           n_candidates=settings.n_candidates,
                           seed=value_seed(settings.seed, o.kind, space.template),  # one sample a format
                           batch_size=settings.batch_size, device=settings.device, scorer=scorers(m, prompt))
        if advance is not None:
            advance(1)
        return got

    audited = {key: measure(model, o, space) for key, (o, space) in first.items()}
    referenced = ({key: measure(reference, o, space) for key, (o, space) in first.items()}
                  if reference is not None else {})
    null_rows, thresholds = [], {}
    for (kind, template), members in formats.items():
        drawn = _null_values(members[0][1], values_by_kind.get(kind, set()),
                             random.Random(value_seed(settings.seed, "null", kind, template)))
        bits = []
        with evaluating(model):  # each prompt's never-trained values scored in batches, not one by one
            for j, (o, space) in enumerate(members):
                mine = drawn[j::len(members)]  # the values measured after this member's prompt below
                score_values(scorers(model, prompt_of(o, space)), tokenizer, o.between, mine)
        for i, v in enumerate(drawn):
            o, space = members[i % len(members)]
            e = measure(model, o, dataclasses.replace(space, value=v))
            null_rows.append({"kind": kind, "template": template, "value": v,
                              "prompt_example_id": o.example_id, **_columns(e)})
            if e.bits is not None:
                bits.append(e.bits)
        thresholds[(kind, template)] = null_threshold(bits)
    out = {}
    for key, (o, space) in first.items():
        e, ref = audited[key], referenced.get(key)
        p99 = thresholds[(o.kind, space.template)]
        above_ref = reference is None or (ref is not None and ref.bits is not None and e.bits is not None
                                          and e.bits > ref.bits)
        exposed = None if e.bits is None or p99 is None else bool(e.bits > p99 and above_ref)
        out[key] = {**_columns(e), "exposure_template": space.template, "exposure_space_bits": space.bits,
                    "value_copies": copies[key], "exposure_null_p99": p99, "exposed": exposed,
                    "reference_exposure": ref.bits if ref else None,
                    "reference_exposure_method": ref.method if ref else None,
                    "reference_exposure_rank": ref.rank if ref else None}
    return out, pd.DataFrame(null_rows, columns=NULL_COLUMNS)


def null_threshold(bits: Sequence[float]) -> float | None:
    """The null's 99th percentile: its sample quantile, or log2 100 = 6.6 bits (that of a
    never-trained value's exposure under an exact rank, uniform over its space) when higher,
    because 20 values cannot place a 99th percentile (their quantile sits near their maximum,
    which a uniform rank exceeds 5 % of the time).  None without a measured null value."""
    if not len(bits):
        return None
    return max(float(np.quantile(bits, NULL_QUANTILE)), -math.log2(1.0 - NULL_QUANTILE))


def _columns(e: Exposure) -> dict:
    return {"exposure": e.bits, "exposure_method": e.method, "exposure_rank": e.rank,
            "exposure_nodes": e.nodes, "exposure_candidates": e.candidates, "exposure_fit": e.fit}


def _null_values(space: ValueSpace, taken: set[str], rng: random.Random) -> list[str]:
    """Up to ``NULL_VALUES`` distinct values of ``space`` that the run does not hold."""
    out: list[str] = []
    room = space.size - sum(1 for v in taken if space.allows(v))
    for _ in range(100 * NULL_VALUES):
        if len(out) >= min(NULL_VALUES, room):
            break
        v = space.random(rng)
        if v not in taken and v not in out:
            out.append(v)
    return out
