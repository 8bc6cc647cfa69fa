"""The cost model (DESIGN.md §3): which way a layer's Gram block is formed, by FLOPs and memory.

Two choices: for a pair of ``OuterRep`` (``grams.inner``), ghost (the two (BT)×(BT) factor
Grams) or materialise (the per-example gradients and their Gram), within a memory budget
(``choose_path``); for a Linear-like layer's call (``kernels.linear``), the fused path (its
per-example weight gradients serve as the batch gradient, ``engine.kernels.fused``) or ghost
(``fused_is_cheaper``).
"""

from __future__ import annotations

from typing import Literal

from gnq_core.engine.math.representations import (
    DEFAULT_MEMORY_BUDGET,
    DenseFactor,
    Factor,
    OneHotFactor,
    OuterRep,
    compute_dtype,
    dense_values,
)

InnerPath = Literal["ghost", "materialize"]


def _factor_cost(f: Factor) -> int:
    return 1 if isinstance(f, OneHotFactor) else f.width


def ghost_pair_flops(r: OuterRep, s: OuterRep) -> float:
    """FLOPs of the ghost Gram: the two (BT)×(BT) factor Grams (DESIGN.md §3)."""
    rows, cols = r.batch * r.length, s.batch * s.length
    return 2.0 * rows * cols * (_factor_cost(r.A) + _factor_cost(r.C) + 1)


# What writing one element of a materialised per-example gradient and reading it back for the
# Gram costs, in FLOPs of a large matmul.  Calibrated on CPU by `python -m benchmarks.crossover`:
# with it the model's ghost/materialise crossover matches the measured one for d = 64, 256 and
# 1024 (without it, materialising looked cheaper than it is for wide layers at moderate T).
MATERIALIZE_ELEMENT_FLOPS = 128.0


def materialize_flops(r: OuterRep, s: OuterRep) -> float:
    """FLOPs (matmul-equivalent) of materialising both sides' per-example gradients and their Gram."""
    per_ex = 2.0 * (r.batch * r.length + (0 if s is r else s.batch * s.length))
    numel = _materialized_numel(r, s)
    if isinstance(r.A, OneHotFactor):  # scatter-add: one add per element of C
        per_ex = per_ex / max(numel // max(r.C.width + int(r.bias), 1), 1)
    memory = MATERIALIZE_ELEMENT_FLOPS * (r.batch + (0 if s is r else s.batch)) * numel
    return per_ex * numel + 2.0 * r.batch * s.batch * numel + memory


def _materialized_numel(r: OuterRep, s: OuterRep) -> int:
    """Size of one materialised gradient; a one-hot Gram with itself needs only used rows."""
    if s is r and isinstance(r.A, OneHotFactor):
        return min(r.A.n, r.batch * r.length) * (r.C.width + int(r.bias))
    return r.numel


def _signature(r: OuterRep) -> tuple:
    """What the cost model of a representation depends on: factor kinds, shapes, dtype."""
    def factor(f: Factor) -> tuple:
        return (f.values.shape, f.values.dtype) if isinstance(f, DenseFactor) else (f.tokens.shape, f.n)
    return factor(r.A), factor(r.C), r.bias


_PATHS: dict[tuple, InnerPath] = {}  # cost-model decisions by shape: a step asks the same ones


def choose_path(r: OuterRep, s: OuterRep, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> InnerPath:
    """Cheaper of ghost and materialise for this pair, by the cost model of DESIGN.md §3."""
    key = (_signature(r), None if s is r else _signature(s), memory_budget)
    path = _PATHS.get(key)
    if path is None:
        if len(_PATHS) > 4096:
            _PATHS.clear()
        path = _PATHS[key] = _choose_path(r, s, memory_budget)
    return path


def _choose_path(r: OuterRep, s: OuterRep, memory_budget: int) -> InnerPath:
    bytes_per = compute_dtype(dense_values(r)).itemsize
    materialize_bytes = (r.batch + (0 if s is r else s.batch)) * _materialized_numel(r, s) * bytes_per
    if materialize_bytes > memory_budget:
        return "ghost"
    return "ghost" if ghost_pair_flops(r, s) <= materialize_flops(r, s) else "materialize"


# What the fused path costs per element of the B per-example gradients beyond its Gram's 2B
# FLOPs, in FLOPs of the layer's own plain step: writing G in cache-sized chunks and reading it
# back for Σ_j and the Gram, and per-example products with inner dimension T instead of B·T.
# Measured by `python -m benchmarks.fused_cost` (CPU, one thread, B8 T64, SmolLM2-135M's and
# GPT-2 small's Linear shapes) with MKL forming the Gram: 34–84, median 49; with the CPU Gram
# kernel (``cpu_gram``) it measures ≈ 21 (the committed results), so 48 is the charge where the
# kernel does not apply and a conservative one where it does.  Lower than ``MATERIALIZE_ELEMENT_FLOPS``
# (the unfused path writes all of G to memory and reads it back): with that constant the model
# picked ghost for SmolLM2's tied head and GPT-2's layers, where fused measured 1.13–1.26× a
# plain layer step and ghost 1.19–1.33×.
FUSED_ELEMENT_FLOPS = 48.0


def fused_flops(batch: int, rows: int, cols: int) -> float:
    """Extra cost of the fused path: the Gram of the per-example gradients and their memory."""
    return (2.0 * batch + FUSED_ELEMENT_FLOPS) * batch * rows * cols


def ghost_linear_flops(batch: int, length: int, rows: int, cols: int) -> float:
    """Extra FLOPs of the ghost path for the same layer (autograd keeps its own matmul)."""
    return 2.0 * (batch * length) ** 2 * (rows + cols + 1)


def fused_is_cheaper(batch: int, length: int, rows: int, cols: int) -> bool:
    """Whether a Linear-like layer [rows, cols] at B = ``batch``, T = ``length`` costs less
    fused than ghost (ties go to fused)."""
    return fused_flops(batch, rows, cols) <= ghost_linear_flops(batch, length, rows, cols)
