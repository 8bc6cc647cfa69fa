"""Per-example gradient representations and their batch Gram (inner-product) matrices.

A kernel turns a module call's captured input and output gradient into a *representation*
of that call's per-example parameter gradients, without materialising them:

* ``OuterRep(A, C)``: g_j = A_jᵀ C_j, with A_j ∈ R^{T×p0}, C_j ∈ R^{T×p1} (a sum of T outer
  products).  Linear: A = Δ, C = X; HF Conv1D: A = X, C = Δ; Embedding: A = one-hot(tokens),
  C = Δ; Conv: A = Δ, C = unfolded patches.  ``bias=True`` appends a ones column to C, which
  adds the bias gradient Σ_t A_jt.
* ``DenseRep(G)``: the per-example gradients themselves, G ∈ R^{B×n} (generic fallback).

``inner(r, s)`` is the B×B matrix ⟨g^r_j, g^s_k⟩ for two representations of the same
parameter(s).  For two ``OuterRep`` it uses the ghost identity over *all* position pairs:
⟨A_jᵀC_j, A_kᵀC_k⟩ = Σ_{t,t'} (A_j A_kᵀ)_{tt'} (C_j C_kᵀ)_{tt'}  (blocksum of a Hadamard
product), or materialises the gradients when the cost model says that is cheaper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

InnerPath = Literal["ghost", "materialize"]

# Largest intermediate (BT×BT Gram block or B×n gradients) built at once, in bytes.
DEFAULT_MEMORY_BUDGET = 256 * 2**20


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """Grams run in float64 for float64 models and in float32 otherwise (bf16/fp16 upcast)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


@dataclass
class DenseFactor:
    """A dense factor: values[j, t, :] for example j and position t."""

    values: torch.Tensor  # [B, T, p]

    @property
    def width(self) -> int:
        return self.values.shape[-1]


@dataclass
class OneHotFactor:
    """An implicit one-hot factor (embedding lookups): row tokens[j, t] of an n-wide identity."""

    tokens: torch.Tensor  # [B, T] long
    n: int

    @property
    def width(self) -> int:
        return self.n


Factor = DenseFactor | OneHotFactor


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


@dataclass
class OuterRep:
    """g_j = A_jᵀ [C_j | 1?]: a sum over positions of outer products (see module doc)."""

    A: Factor
    C: Factor
    bias: bool = False

    @property
    def batch(self) -> int:
        return _batch_of(self.A)

    @property
    def length(self) -> int:
        return _length_of(self.A)

    @property
    def numel(self) -> int:
        return self.A.width * (self.C.width + int(self.bias))

    def materialize(self, compact: bool = False) -> torch.Tensor:
        """Per-example gradients, [B, p0·(p1 + bias)], in the parameter's own layout.

        ``compact``: for one-hot rows keep at most B·T rows, those of tokens that occur (a Gram
        with itself is the same; the layout is no longer the parameter's).  Their number is
        fixed by the shape, not counted, so nothing waits for the device.
        """
        C = self.C
        if not isinstance(C, DenseFactor):
            raise TypeError("OuterRep.C must be dense to materialise")
        dtype = compute_dtype(C.values)
        c = C.values.to(dtype)
        if self.bias:
            c = torch.cat([c, c.new_ones(*c.shape[:-1], 1)], dim=-1)
        B, T, p1 = c.shape
        if isinstance(self.A, OneHotFactor):
            tokens, n = self.A.tokens, self.A.n
            if compact and n > B * T:  # rows of tokens that occur: each token's first sorted slot
                tokens = _first_slots(tokens)
                n = B * T
            G = c.new_zeros(B, n, p1)
            G.scatter_add_(1, tokens.unsqueeze(-1).expand(B, T, p1), c)
        else:
            G = torch.einsum("bta,btc->bac", self.A.values.to(dtype), c)
        return G.reshape(B, -1)


def _first_slots(tokens: torch.Tensor) -> torch.Tensor:
    """Each token's index in the sorted token list (its first copy): distinct tokens get
    distinct slots in [0, B·T) without counting them (torch.unique would sync)."""
    flat = tokens.reshape(-1)
    return torch.searchsorted(torch.sort(flat).values, flat).view(tokens.shape)


@dataclass
class DenseRep:
    """Explicit per-example gradients, [B, n] (parameter layout, flattened)."""

    G: torch.Tensor

    @property
    def batch(self) -> int:
        return self.G.shape[0]

    def materialize(self) -> torch.Tensor:
        return self.G


Rep = OuterRep | DenseRep


def _batch_of(f: Factor) -> int:
    return (f.values if isinstance(f, DenseFactor) else f.tokens).shape[0]


def _length_of(f: Factor) -> int:
    return (f.values if isinstance(f, DenseFactor) else f.tokens).shape[1]


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
    bytes_per = 8 if compute_dtype(_any_values(r)) == torch.float64 else 4
    materialize_bytes = (r.batch + (0 if s is r else s.batch)) * _materialized_numel(r, s) * bytes_per
    if materialize_bytes > memory_budget:
        return "ghost"
    return "ghost" if ghost_pair_flops(r, s) <= materialize_flops(r, s) else "materialize"


def _any_values(r: OuterRep) -> torch.Tensor:
    return r.C.values if isinstance(r.C, DenseFactor) else r.A.values  # type: ignore[union-attr]


def ghost_inner(
    r: OuterRep, s: OuterRep, memory_budget: int = DEFAULT_MEMORY_BUDGET
) -> torch.Tensor:
    """blocksum((A_r A_sᵀ) ⊙ (C_r C_sᵀ [+1])) over all position pairs, in row chunks."""
    dtype = compute_dtype(_any_values(r))
    B_r, T_r, B_s, T_s = r.batch, r.length, s.batch, s.length
    bytes_per_row = T_r * B_s * T_s * (8 if dtype == torch.float64 else 4) * 2
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
    out = torch.empty(B_r, B_s, dtype=torch.float64, device=_any_values(r).device)
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


def restrict_rows(rep: Rep, rows: torch.Tensor) -> Rep | None:
    """The same gradients restricted to parameter rows ``rows`` (sorted) of A's side.

    For a tied embedding/head weight, the cross terms with the embedding's uses only involve
    the rows of tokens that occur, so the head's Δ [B, T, V] can be kept as Δ[..., rows] until
    the embedding's gradient arrives.  Returns None when the representation cannot be
    restricted (then it is kept whole).  Every token of a ``OneHotFactor`` factor must be in rows.
    ``rows`` may repeat (their number is fixed by the shapes, not counted on the device): a
    one-hot factor maps each token to its first copy, so an inner product of a restricted dense
    side with a restricted one-hot side counts each row once.  Two restricted dense sides
    would count repeats twice; the auditor only pairs them before restricting.
    """
    if not isinstance(rep, OuterRep):
        return None
    if isinstance(rep.A, DenseFactor):
        A: Factor = DenseFactor(rep.A.values.index_select(-1, rows.to(rep.A.values.device)))
    else:
        A = OneHotFactor(torch.searchsorted(rows.to(rep.A.tokens.device), rep.A.tokens), rows.numel())
    return OuterRep(A, rep.C, rep.bias)
