"""Per-example gradient representations.

A kernel turns a module call's captured input and output gradient into a *representation*
of that call's per-example parameter gradients, without materialising them:

* ``OuterRep(A, C)``: g_j = A_jᵀ C_j, with A_j ∈ R^{T×p0}, C_j ∈ R^{T×p1} (a sum of T outer
  products).  Linear: A = Δ, C = X; HF Conv1D: A = X, C = Δ; Embedding: A = one-hot(tokens),
  C = Δ; Conv: A = Δ, C = unfolded patches.  ``bias=True`` appends a ones column to C, which
  adds the bias gradient Σ_t A_jt.
* ``DenseRep(G)``: the per-example gradients themselves, G ∈ R^{B×n} (generic fallback).

Their batch Gram matrices are ``engine.math.grams``; which way they are formed, ``engine.math.cost_model``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Largest intermediate (BT×BT Gram block or B×n gradients) built at once, in bytes.
DEFAULT_MEMORY_BUDGET = 256 * 2**20


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """Grams run in float64 for float64 models and in float32 otherwise (bf16/fp16 upcast)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def as_sequence(t: torch.Tensor, B: int, width: int | None = None) -> torch.Tensor:
    """[B, ..., d] as [B, T, width] (default: the last dim; no op when it already is that: this
    runs per layer per step)."""
    width = t.shape[-1] if width is None else width
    return t if t.dim() == 3 and t.shape[-1] == width else t.reshape(B, -1, width)


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


@dataclass
class OuterRep:
    """g_j = A_jᵀ [C_j | 1?]: a sum over positions of outer products (see module doc)."""

    A: Factor
    C: Factor
    bias: bool = False

    @property
    def batch(self) -> int:
        return factor_tensor(self.A).shape[0]

    @property
    def length(self) -> int:
        return factor_tensor(self.A).shape[1]

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


def factor_tensor(f: Factor) -> torch.Tensor:
    """A factor's tensor: its values [B, T, p] or its tokens [B, T]."""
    return f.values if isinstance(f, DenseFactor) else f.tokens


def dense_values(r: OuterRep) -> torch.Tensor:
    """The values of a dense factor of ``r`` (C's, else A's): its dtype and device are the rep's."""
    return r.C.values if isinstance(r.C, DenseFactor) else r.A.values  # type: ignore[union-attr]


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
