"""The upper triangle of a chunk's Gram F Fᵀ on a CPU, in one pass over F (numba).

The fused path's Gram of B per-example gradient rows [B, N] is a matmul with B output rows: MKL
runs it at ≈ 45 GFLOP/s on one core whatever N is, reading F back from memory it just wrote
(DESIGN.md §3).  This kernel keeps the 36 products of an 8-row block in registers and reads each
element of F once: 2 MiB of float32 at B=8, one thread, 34–52 µs with F in cache and 81–88 µs
from memory, against 185 and 224 µs for ``addmm_`` (`python -m benchmarks.fused_cost`).  Rows beyond
8 go in blocks of 8 (diagonal blocks as above, off-diagonal ones as 4×4 tiles).  Summation
order differs from MKL's (reassociation is allowed so the loop vectorises), as it does between
any two BLAS builds; NaN and Inf propagate.

``upper_gram_(acc, F)`` adds the entries j ≤ k of F Fᵀ to ``acc`` and returns True, or returns
False when the kernel is not available (numba missing or failing to compile) or does not apply
(a dtype other than float32/float64, more intra-op threads than it was measured at); the caller
then uses ``addmm_``.  ``upper_gram_(acc, F, sums)`` also adds Σ_j F_j to ``sums`` in the same
pass: the fused path's weight gradient, which a ones-row product read F a second time for
(SmolLM2-135M: 2,115 chunks a step, 0.26 s of a 4.4 s step at one thread).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

# Measured faster than MKL's threaded small-height matmul at 1 and 2 threads (this machine's
# cores); with more threads MKL's own parallel products are used, not measured here.
MAX_THREADS = 2

_DTYPES = (torch.float32, torch.float64)


def applies(flat: torch.Tensor) -> bool:
    """Whether ``upper_gram_`` will take this [B, N] block (before making an accumulator for it)."""
    return (flat.dtype in _DTYPES and flat.device.type == "cpu" and flat.is_contiguous()
            and torch.get_num_threads() <= MAX_THREADS and _kernel() is not None)


def upper_gram_(acc: torch.Tensor, flat: torch.Tensor, sums: torch.Tensor | None = None) -> bool:
    """acc[j, k] += ⟨flat_j, flat_k⟩ for j ≤ k (acc and flat contiguous, on CPU, same dtype);
    with ``sums`` (contiguous, flat's width and dtype) also sums += Σ_j flat_j."""
    if acc.dtype != flat.dtype or not acc.is_contiguous() or not applies(flat):
        return False
    if sums is not None and (sums.dtype != flat.dtype or not sums.is_contiguous()
                             or sums.numel() != flat.shape[1] or sums.device.type != "cpu"):
        return False
    out = (sums if sums is not None else flat.new_empty(0)).view(-1)
    _kernel()(flat.numpy(), acc.numpy(), out.numpy())
    return True


def chunk_kernel(acc: torch.Tensor, flat: torch.Tensor, sums: torch.Tensor
                 ) -> Callable[[int, int], None] | None:
    """For a loop over equal chunks (the fused path's rows): ``run(start, stop)`` adds the Gram of
    ``flat`` (refilled by the caller before each call) to ``acc`` and its rows' sum to
    ``sums[start:stop]`` (rows of a [rows, cols] tensor, flat holding B × (stop - start) × cols).
    The checks and array views are made once here, not per chunk (2,115 chunks a step on
    SmolLM2-135M).  None where ``upper_gram_`` would not apply."""
    if (acc.dtype != flat.dtype or not acc.is_contiguous() or not applies(flat) or sums.dtype != flat.dtype
            or not sums.is_contiguous() or sums.device.type != "cpu"):
        return None
    kernel, F, A, W = _kernel(), flat.numpy(), acc.numpy(), sums.numpy()

    def run(start: int, stop: int) -> None:
        kernel(F, A, W[start:stop].reshape(-1))

    return run


@functools.cache
def _kernel():
    """The compiled driver, or None where numba is missing or cannot compile it."""
    try:
        from gnq_core.engine.math import numba_gram as impl

        probe = torch.arange(6.0, dtype=torch.float64).view(2, 3)
        out = torch.zeros(2, 2, dtype=torch.float64)
        for dtype in _DTYPES:  # compiles (or loads the cache) once, with and without sums
            F, acc = probe.to(dtype).numpy(), out.to(dtype).numpy()
            impl.upper_gram(F, acc, torch.zeros(3, dtype=dtype).numpy())
            impl.upper_gram(F, acc, torch.zeros(0, dtype=dtype).numpy())
        return impl.upper_gram
    except Exception:  # noqa: BLE001 — any failure means: use the BLAS path
        return None
