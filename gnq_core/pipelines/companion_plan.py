"""What a companions audit (``--companions N|all``) will hold, known before it runs: its sketch
and the memory of its largest set, checked against the room before anything is written.  Light
(no model code), so the dashboard's form can check it too."""

from __future__ import annotations

import torch

from gnq_core.engine.sketch import SketchSpec
from gnq_core.pipelines.settings import AuditSettings
from gnq_core.results.records import MIN_BATCH_SIZE
from gnq_core.runtime import resolve_dtype
from gnq_core.sources.limits import LimitError, available_memory, format_bytes

__all__ = ["check_companion_memory", "companion_memory", "sketch_spec"]


def companion_memory(n: int, m: int, itemsize: int) -> int:
    """Bytes a companion set of ``n`` texts with sketches ``m`` wide holds at its peak: the
    sketches (``itemsize`` bytes a number) with their float64 Gram, or the n × n solve's three
    matrices (K, L, M) once the sketches are gone; n > m: the sketches and the m × m system."""
    sketches = n * m * itemsize
    if n <= m:
        return max(sketches + 8 * n * n, 3 * 8 * n * n)
    return sketches + 3 * 8 * m * m


def check_companion_memory(n_texts: int, settings: AuditSettings) -> None:
    """Refuse, before the audit, companion sets that need more memory than there is (one line
    naming the need, the room and the largest N that fits): their size is known in advance."""
    size = settings.companion_set_size
    if size is None or n_texts < MIN_BATCH_SIZE:
        return
    n = min(size or n_texts, n_texts)
    spec = sketch_spec(settings)
    m = spec.shared or spec.k  # side by side: at least one matrix's k (a lower bound)
    itemsize = 8 if resolve_dtype(settings.dtype) == torch.float64 else 4
    need = companion_memory(n, m, itemsize)
    room, source = available_memory()
    if need <= room:
        return
    fits, over = 0, n  # the largest set that fits, by bisection (the need grows with the set)
    while over - fits > 1:
        mid = (fits + over) // 2
        fits, over = (mid, over) if companion_memory(mid, m, itemsize) <= room else (fits, mid)
    way = (f"use --companions N with N at most {fits - 1:,}" if fits > MIN_BATCH_SIZE
           else "there is not room for a companion set of 3 texts")
    raise LimitError(f"--companions {settings.companions}: a companion set of {n:,} texts needs about "
                     f"{format_bytes(need)} of memory (its sketches, {n:,} x {m:,} numbers, and its solve) "
                     f"but {source} is {format_bytes(room)}; refused before the audit: {way}, or give "
                     "fewer texts")


def sketch_spec(settings: AuditSettings) -> SketchSpec:
    """The sketch of a companions audit: ``sketch_k`` per matrix, seeded by the audit's seed."""
    return SketchSpec(k=settings.sketch_k, seed=settings.seed, vocab_rows=settings.sketch_vocab_rows)


