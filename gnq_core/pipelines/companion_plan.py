"""What a companions audit (``--companions N|all``) will hold, known before it runs: its sketch
and the memory of its largest set, checked against the room before anything is written.  Light
(no model code), so the dashboard's form can check it too."""

from __future__ import annotations

from gnq_core.engine.sketch.companions import held_bytes, streamed_bytes
from gnq_core.engine.sketch.projection import SketchSpec
from gnq_core.pipelines.options import companion_set_size
from gnq_core.pipelines.settings import COMPANIONS_ALL, AuditSettings
from gnq_core.results.records import MIN_BATCH_SIZE
from gnq_core.sources.limits import LimitError, available_memory, format_bytes

__all__ = ["TRAINING_SET_TOTAL", "check_companion_memory", "companion_memory", "sketch_spec"]

# m of the training-set mode (``all``): the shared vector's dimensions, so that its m × m system is
# one 2 GiB float64 matrix.  benchmarks/results/sketch_error-training-set-cpu.json: GNQ median
# relative error 1.3% (GPT-2) / 1.1% (Llama), Spearman 0.994 / 0.999, inside the envelope
# (DESIGN.md §9); 8,192 left GPT-2 at its edge (Spearman 0.990, worst seed 0.9898).
TRAINING_SET_TOTAL = 16384


def companion_memory(n: int, m: int, itemsize: int, solve: str = "auto") -> int:
    """Bytes a companion set of ``n`` texts with sketches ``m`` wide holds at its peak: the n × n
    path holds the sketches (``itemsize`` bytes a number) and the solve's n × n matrices; the
    streamed path one m × m system whatever n.  ``auto`` takes the smaller, as the audit does."""
    held, streamed = held_bytes(n, m, itemsize), streamed_bytes(m)
    return {"texts": held, "sketch": streamed}.get(solve, min(held, streamed))


def check_companion_memory(n_texts: int, settings: AuditSettings) -> None:
    """Refuse, before the audit, companion sets that need more memory than there is (one line
    naming the need, the room and the largest N that fits): their size is known in advance."""
    n = companion_set_size(settings, n_texts)
    if n is None or n_texts < MIN_BATCH_SIZE:
        return
    spec = sketch_spec(settings)
    m = spec.shared or spec.k  # side by side: at least one matrix's k (a lower bound)
    # sketches and Grams are float64 for float64 models, else float32 ("auto" and bf16 included)
    itemsize = 8 if settings.dtype == "float64" else 4
    solve = settings.companions_solve
    need = companion_memory(n, m, itemsize, solve)
    room, source = available_memory()
    if need <= room:
        return
    fits, over = 0, n  # the largest set that fits, by bisection (the need grows with the set)
    while over - fits > 1:
        mid = (fits + over) // 2
        fits, over = (mid, over) if companion_memory(mid, m, itemsize, solve) <= room else (fits, mid)
    way = (f"use --companions N with N at most {fits - 1:,}" if fits > MIN_BATCH_SIZE
           else "there is not room for a companion set of 3 texts")
    held = "its sketches, {n:,} x {m:,} numbers, and its solve"
    what = f"its {m:,} x {m:,} system, streamed" if need == streamed_bytes(m) < held_bytes(n, m, itemsize) \
        else held.format(n=n, m=m)
    raise LimitError(f"--companions {settings.companions}: a companion set of {n:,} texts needs about "
                     f"{format_bytes(need)} of memory ({what}) "
                     f"but {source} is {format_bytes(room)}; refused before the audit: {way}, a smaller "
                     "--sketch-total, or fewer texts")


def sketch_spec(settings: AuditSettings) -> SketchSpec:
    """The sketch of a companions audit: ``sketch_k`` per matrix, seeded by the audit's seed, folded
    into ``sketch_total`` dimensions (default: ``TRAINING_SET_TOTAL`` against all the texts, else
    the window's 65,536)."""
    total = settings.sketch_total
    if total is None:
        total = TRAINING_SET_TOTAL if settings.companions == COMPANIONS_ALL else SketchSpec.total
    return SketchSpec(k=settings.sketch_k, seed=settings.seed, vocab_rows=settings.sketch_vocab_rows,
                      total=total)
