"""Batch Gram (inner-product) matrices of per-example gradient representations.

``inner(r, s)`` is the B×B matrix ⟨g^r_j, g^s_k⟩ for two representations of the same
parameter(s) (``engine.math.representations``).  For two ``OuterRep`` it uses the ghost identity
over *all* position pairs: ⟨A_jᵀC_j, A_kᵀC_k⟩ = Σ_{t,t'} (A_j A_kᵀ)_{tt'} (C_j C_kᵀ)_{tt'}
(blocksum of a Hadamard product), or materialises the gradients when the cost model
(``engine.math.cost_model``) says that is cheaper.
"""

from __future__ import annotations

import torch

from gnq_core.engine.math.cost_model import InnerPath, choose_path
from gnq_core.engine.math.representations import (
    DEFAULT_MEMORY_BUDGET,
    DenseFactor,
    Factor,
    OneHotFactor,
    OuterRep,
    Rep,
    compute_dtype,
    dense_values,
)


def _rows(f: Factor, start: int, stop: int) -> Factor:
    if isinstance(f, DenseFactor):
        return DenseFactor(f.values[start:stop])
    return OneHotFactor(f.tokens[start:stop], f.n)


def _factor_gram(f: Factor, h: Factor, dtype: torch.dtype) -> torch.Tensor:
    """(b·T_f) × (B·T_h) matrix of inner products between the rows of two factors."""
    if isinstance(f, DenseFactor) and isinstance(h, DenseFactor):
        return _flat(f.values).to(dtype) @ _flat(h.values).to(dtype).T
    if isinstance(f, OneHotFactor) and isinstance(h, OneHotFactor):
        return (f.tokens.reshape(-1, 1) == h.tokens.reshape(1, -1)).to(dtype)
    if isinstance(f, OneHotFactor):  # ⟨e_tok, v⟩ = v[tok]
        return _flat(h.values).to(dtype)[:, f.tokens.reshape(-1)].T
    return _flat(f.values).to(dtype)[:, h.tokens.reshape(-1)]


# A factor Gram with itself of at least this many FLOPs is formed from its upper block triangle
# only (B row-block products instead of one): about (B+1)/(2B) of the FLOPs for 2B more ops, so
# only where the ops are negligible (a large-vocabulary head's ΔΔᵀ: SmolLM2-135M at B8 T64,
# 512×512 over 49,152, 248 ms → 171 ms on one CPU thread).
SYMMETRIC_GRAM_FLOPS = 2e9


def _self_gram_upper(f: Factor, dtype: torch.dtype) -> torch.Tensor | None:
    """f fᵀ's example blocks (j, k ≥ j), zero below them, or None where the whole product is
    cheaper (small, or not dense)."""
    if not isinstance(f, DenseFactor):
        return None
    v = _flat(f.values).to(dtype)
    n, B = v.shape[0], f.values.shape[0]
    if B < 2 or 2.0 * n * n * v.shape[1] < SYMMETRIC_GRAM_FLOPS:
        return None
    T = n // B
    out = torch.zeros(n, n, dtype=dtype, device=v.device)
    for j in range(B):
        out[j * T:(j + 1) * T, j * T:] = v[j * T:(j + 1) * T] @ v[j * T:].T
    return out


def _flat(v: torch.Tensor) -> torch.Tensor:
    """[B, T, p] -> [B·T, p] (explicit sizes: p may be 0 for a bias-only factor)."""
    return v.reshape(v.shape[0] * v.shape[1], v.shape[2])


def ghost_inner(
    r: OuterRep, s: OuterRep, memory_budget: int = DEFAULT_MEMORY_BUDGET
) -> torch.Tensor:
    """blocksum((A_r A_sᵀ) ⊙ (C_r C_sᵀ [+1])) over all position pairs, in row chunks."""
    dtype = compute_dtype(dense_values(r))
    B_r, T_r, B_s, T_s = r.batch, r.length, s.batch, s.length
    bytes_per_row = T_r * B_s * T_s * dtype.itemsize * 2
    chunk = max(1, min(B_r, memory_budget // max(bytes_per_row, 1)))

    def rows(A: Factor, C: Factor, a: torch.Tensor | None = None) -> torch.Tensor:
        a = _factor_gram(A, s.A, dtype) if a is None else a
        c = _factor_gram(C, s.C, dtype)
        prod = a * (c + 1) if r.bias else a * c
        return prod.view(-1, T_r, B_s, T_s).sum(dim=(1, 3)).to(torch.float64)

    if chunk >= B_r:  # one chunk (the usual case): no slicing, no output buffer
        upper = _self_gram_upper(r.A, dtype) if s is r else None
        if upper is not None:  # the Gram's upper triangle (its lower is zero), mirrored
            gram = rows(r.A, r.C, upper)
            return gram + gram.triu(1).T
        return rows(r.A, r.C)
    out = torch.empty(B_r, B_s, dtype=torch.float64, device=dense_values(r).device)
    for start in range(0, B_r, chunk):
        stop = min(B_r, start + chunk)
        out[start:stop] = rows(_rows(r.A, start, stop), _rows(r.C, start, stop))
    return out


def inner(r: Rep, s: Rep, path: InnerPath | None = None, memory_budget: int = DEFAULT_MEMORY_BUDGET
          ) -> tuple[torch.Tensor, str]:
    """B×B inner products ⟨g^r_j, g^s_k⟩ and the path used ("ghost", "materialize", "dense")."""
    if isinstance(r, OuterRep) and isinstance(s, OuterRep):
        if r.bias != s.bias:
            raise ValueError("cannot pair representations of different parameter sets")
        chosen = path or choose_path(r, s, memory_budget)
        if chosen == "ghost":
            return ghost_inner(r, s, memory_budget), "ghost"
    else:
        chosen = "dense"
    g_r = r.materialize(compact=True) if s is r and isinstance(r, OuterRep) else r.materialize()
    g_s = g_r if s is r else s.materialize()
    if g_r.shape[1] != g_s.shape[1]:
        raise ValueError(f"parameter size mismatch: {g_r.shape[1]} vs {g_s.shape[1]}")
    dtype = torch.promote_types(g_r.dtype, g_s.dtype)
    gram = g_r.to(dtype) @ g_s.to(dtype).T
    return gram.to(torch.float64), ("materialize" if chosen == "materialize" else "dense")
