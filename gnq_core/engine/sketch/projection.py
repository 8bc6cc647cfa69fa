"""Seeded random projections of per-example gradients, formed without the gradients (DESIGN.md §9).

A sketch replaces each text's gradient g_j ∈ R^P by s_j = Π g_j ∈ R^m with a fixed random Π
(E[ΠᵀΠ] = I, so E⟨s_j, s_k⟩ = ⟨g_j, g_k⟩), and K by the Gram of the sketches.  Π is a block
diagonal over parameters, each block seeded by (seed, parameter names), so the same text gets
the same sketch in any micro-batch, window, process or later audit: sketches of different
batches can be put in one Gram.

* A weight matrix whose per-example gradient is g_j = A_jᵀ C_j (``OuterRep``: Linear, Conv1D,
  Embedding, Conv) is projected Kronecker style in r = k / b² independent blocks of side b:
  block i is R_{A,i}ᵀ A_jᵀ C_j R_{C,i} = Σ_t (R_{A,i}ᵀ a_jt)(R_{C,i}ᵀ c_jt)ᵀ, a b × b matrix
  summed over positions (scaled by √r).  Each factor is projected on its own (cost B·T·p·r·b),
  the gradient never exists.  One √k × √k block (``block=None``) has 3-4× the variance for the
  same k (DESIGN.md §9).  A matrix no larger than k is kept whole (R = I); a side no wider than
  b is kept whole and the other projected to k / p.
* Explicit per-example gradients (``DenseRep``: norm layers, the generic kernel) of width n > k
  get a dense Gaussian projection to k; narrower ones are kept whole.
* Vocabulary-sized parameters (token embeddings, the output head, tied or not: they dominate
  ‖g‖²) are treated apart: their vocabulary side by a CountSketch (each token to one of
  ``vocab_rows`` buckets with a random sign; a logit gradient softmax − one-hot is concentrated
  on few tokens, so few of them collide), their hidden side kept whole by default
  (``vocab_cols=None``, "one-sided") or projected to ``vocab_cols``.

* ``columns`` bounds the projected columns per side summed over the model's weight matrices
  (the projections' cost): with n matrices (``Sketcher(..., matrices=n)``) each gets
  r = max(1, min(k / b², round(columns / (n·b)))) blocks, so a deep model (SmolLM2: 210
  matrices) gets few blocks per matrix and its error still averages over all of them, while a
  two-layer model keeps k per matrix.
* ``total`` folds every parameter's sketch into ONE shared vector of ``total`` dimensions per
  text (a CountSketch of each parameter's sketch, seeded per parameter): the window holds
  ``total`` numbers per text whatever the model (65,536 float32 = 256 KB).  Inner products stay
  unbiased; ``total=None`` — or a k per matrix above ``total`` (an identity-sized sketch) —
  keeps the parameters' sketches side by side (exact for identity projections).

The sketch is linear in g, so a parameter used several times (a tied embedding/head) gets the
sum of its uses' sketches: no cross terms are needed.  Every projection is unbiased, so the
sketched K is unbiased entry by entry; its error is measured by ``benchmarks/sketch_error.py``
(the defaults below come from that table).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field

import torch
from torch import nn

from gnq_core.engine.math.representations import (
    DenseFactor,
    DenseRep,
    OneHotFactor,
    OuterRep,
    Rep,
    compute_dtype,
)
from gnq_core.engine.math.solve import Solution, gnq_from_kernel

__all__ = ["DEFAULT_BLOCK", "DEFAULT_COLUMNS", "DEFAULT_K", "DEFAULT_TOTAL", "DEFAULT_VOCAB_COLS",
           "DEFAULT_VOCAB_ROWS", "SHARED", "Projection", "SketchBatch", "SketchSpec", "Sketcher",
           "sketched_gnq", "vocab_keys", "weight_matrices"]

# Defaults chosen from benchmarks/results/sketch_error-cpu.json, sketch_error-shared-cpu.json and
# sketch_error-smollm2-cpu.json (see DESIGN.md §9).
DEFAULT_K = 4096
DEFAULT_VOCAB_ROWS = 1024
DEFAULT_VOCAB_COLS: int | None = None
DEFAULT_BLOCK: int | None = 8
DEFAULT_COLUMNS: int | None = 16384
DEFAULT_TOTAL: int | None = 65536
SHARED = "*shared*"  # the key of the shared vector in SketchBatch.parts / Sketcher.widths()


@dataclass(frozen=True)
class SketchSpec:
    """What a sketch is: ``k`` dimensions per weight matrix (√k per side) and per explicit
    gradient, the vocabulary side's buckets, the hidden side of vocabulary parameters
    (None: kept whole), and the seed every projection derives from."""

    k: int = DEFAULT_K
    seed: int = 0
    vocab_rows: int = DEFAULT_VOCAB_ROWS
    vocab_cols: int | None = DEFAULT_VOCAB_COLS
    block: int | None = DEFAULT_BLOCK
    columns: int | None = DEFAULT_COLUMNS
    total: int | None = DEFAULT_TOTAL

    def __post_init__(self) -> None:
        for name, optional in (("block", True), ("columns", True), ("total", True), ("k", False),
                               ("vocab_rows", False), ("vocab_cols", True)):
            value = getattr(self, name)
            if not (optional and value is None) and (not isinstance(value, int) or isinstance(value, bool)
                                                     or value < 1):
                or_none = " or None" if optional else ""
                raise ValueError(f"sketch {name} must be a whole number >= 1{or_none}, got {value!r}")

    @property
    def side(self) -> int:
        """Side of each Kronecker block: ``block``, at most √k (None: √k, one block)."""
        root = max(1, math.isqrt(self.k))
        return root if self.block is None else min(self.block, root)

    def describe(self) -> str:
        cols = "whole" if self.vocab_cols is None else str(self.vocab_cols)
        budget = "" if self.columns is None else f" (at most {self.columns} columns per side in all)"
        shared = "side by side" if self.shared is None else f"folded into {self.shared} shared dimensions"
        return (f"k={self.k} per matrix in {self.side}x{self.side} blocks{budget}, vocabulary "
                f"{self.vocab_rows} buckets x hidden {cols}, {shared}, seed {self.seed}")

    @property
    def shared(self) -> int | None:
        """Dimensions of the shared vector the parameters' sketches are folded into; None (side by
        side) when ``total`` is None or narrower than one matrix's k (an identity-sized sketch)."""
        return None if self.total is None or self.k > self.total else self.total

    def blocks(self, matrices: int | None) -> int:
        """Kronecker blocks per projected matrix: k / b², fewer under ``columns`` for n matrices."""
        b = self.side
        r = max(1, self.k // (b * b))
        if self.columns is None or not matrices:
            return r
        return max(1, min(r, round(self.columns / (matrices * b))))


def _generator(seed: int, key: str, side: str) -> torch.Generator:
    """A generator seeded by (seed, key, side), the same in every process (crc32, not hash())."""
    return torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(f"{key}|{side}".encode())) % 2**63)


class Projection:
    """One side's map R: R^n -> R^k (identity, Gaussian N(0, 1/k), or CountSketch)."""

    def __init__(self, n: int, k: int, kind: str, seed: int, key: str, side: str) -> None:
        if kind not in ("identity", "gauss", "count"):
            raise ValueError(f"unknown projection kind {kind!r}")
        self.n, self.kind = n, kind
        self.k = n if kind == "identity" else k
        self._seed = (seed, key, side)
        # drawn on first use in each (dtype, device), from the same seed: only those copies are held
        self._cache: dict[tuple[torch.dtype, torch.device], torch.Tensor | tuple] = {}

    def _on(self, dtype: torch.dtype, device: torch.device):
        key = (dtype, device)
        if key not in self._cache:
            gen = _generator(*self._seed)
            if self.kind == "gauss":
                base = torch.randn(self.n, self.k, generator=gen, dtype=torch.float64) / math.sqrt(self.k)
                self._cache[key] = base.to(device=device, dtype=dtype)
            else:
                buckets = torch.randint(0, self.k, (self.n,), generator=gen)
                signs = torch.randint(0, 2, (self.n,), generator=gen).to(torch.float64) * 2 - 1
                self._cache[key] = (buckets.to(device), signs.to(device=device, dtype=dtype))
        return self._cache[key]

    def dense(self, v: torch.Tensor) -> torch.Tensor:
        """[..., n] -> [..., k]."""
        if v.shape[-1] != self.n:
            raise ValueError(f"projection of width {self.n} applied to width {v.shape[-1]}")
        if self.kind == "identity":
            return v
        if self.kind == "gauss":
            return v @ self._on(v.dtype, v.device)
        buckets, signs = self._on(v.dtype, v.device)
        out = v.new_zeros(*v.shape[:-1], self.k)
        return out.index_add_(-1, buckets, v * signs)

    def one_hot(self, tokens: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """R's rows for the tokens: [...] long -> [..., k]."""
        if self.kind == "identity":
            return torch.nn.functional.one_hot(tokens, self.n).to(dtype)
        if self.kind == "gauss":
            return self._on(dtype, tokens.device)[tokens]
        buckets, signs = self._on(dtype, tokens.device)
        out = torch.zeros(*tokens.shape, self.k, dtype=dtype, device=tokens.device)
        return out.scatter_(-1, buckets[tokens].unsqueeze(-1), signs[tokens].unsqueeze(-1))

    def matrix(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """R as an explicit n×k matrix (tests: Π applied to explicit gradients)."""
        return self.dense(torch.eye(self.n, dtype=dtype))


def _apply(p: Projection, f: DenseFactor | OneHotFactor, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(f, OneHotFactor):
        return p.one_hot(f.tokens, dtype)
    return p.dense(f.values.to(dtype))


@dataclass
class _Plan:
    rows: Projection
    cols: Projection | None  # None: a DenseRep's single projection
    blocks: int = 1  # r independent Kronecker blocks: rows and cols hold r·s columns each


class Sketcher:
    """Turns (key, representation) pairs into sketches [B, m] under one ``SketchSpec``.

    ``key`` names the parameter(s) a representation belongs to (global names), so every use
    of a parameter and every batch get the same projection; ``vocab`` holds the keys of
    vocabulary-sized parameters (``vocab_keys``)."""

    def __init__(self, spec: SketchSpec, vocab: frozenset[str] = frozenset(),
                 matrices: int | None = None) -> None:
        self.spec = spec
        self.vocab = vocab
        self.matrices = matrices  # weight matrices of the model (``weight_matrices``): the columns budget
        self._plans: dict[str, _Plan] = {}
        self._folds: dict[str, Projection] = {}

    def _plan(self, key: str, rep: Rep) -> _Plan:
        plan = self._plans.get(key)
        s = self.spec
        if isinstance(rep, OuterRep):
            p0, p1 = rep.A.width, rep.C.width + int(rep.bias)
            if plan is None:
                plan = self._outer_plan(key, p0, p1)
                self._plans[key] = plan
            if plan.cols is None or (plan.rows.n, plan.cols.n) != (p0, p1):
                raise ValueError(f"parameter {key!r} was sketched with another shape before")
            return plan
        n = rep.G.shape[1]
        if plan is None:
            plan = self._plans[key] = _Plan(_side(n, s.k, "gauss", s.seed, key, "dense"), None)
        if plan.cols is not None or plan.rows.n != n:
            raise ValueError(f"parameter {key!r} was sketched with another shape before")
        return plan

    def _outer_plan(self, key: str, p0: int, p1: int) -> _Plan:
        s = self.spec

        def side(n: int, k: int | None, kind: str, name: str) -> Projection:
            return _side(n, k, kind, s.seed, key, name)

        if key in self.vocab:  # the vocabulary side CountSketched, the hidden side whole or Gaussian
            if p0 >= p1:
                return _Plan(side(p0, s.vocab_rows, "count", "rows"), side(p1, s.vocab_cols, "gauss", "cols"))
            return _Plan(side(p0, s.vocab_cols, "gauss", "rows"), side(p1, s.vocab_rows, "count", "cols"))
        if p0 * p1 <= s.k:  # no wider than the sketch: kept whole
            return _Plan(side(p0, None, "gauss", "rows"), side(p1, None, "gauss", "cols"))
        b = s.side
        if p0 <= b:  # a narrow side kept whole, the other projected to k / p0
            return _Plan(side(p0, None, "gauss", "rows"), side(p1, max(1, s.k // p0), "gauss", "cols"))
        if p1 <= b:
            return _Plan(side(p0, max(1, s.k // p1), "gauss", "rows"), side(p1, None, "gauss", "cols"))
        r = s.blocks(self.matrices)  # r blocks: each side Gaussian to r·b columns (even if r·b > its width)
        return _Plan(Projection(p0, r * b, "gauss", s.seed, key, "rows"),
                     Projection(p1, r * b, "gauss", s.seed, key, "cols"), blocks=r)

    def sketch(self, key: str, rep: Rep) -> torch.Tensor:
        """[B, m] sketches of one representation's per-example gradients (float64 for float64
        inputs, else float32)."""
        if not isinstance(rep, OuterRep | DenseRep):
            rep = DenseRep(rep.materialize())  # a norm layer's deferred record
        plan = self._plan(key, rep)
        if isinstance(rep, DenseRep):
            G = rep.G.to(compute_dtype(rep.G))
            return plan.rows.dense(G)
        assert plan.cols is not None
        if not isinstance(rep.C, DenseFactor):
            raise TypeError("OuterRep.C must be dense to sketch")
        dtype = compute_dtype(rep.C.values)
        c = rep.C.values.to(dtype)
        if rep.bias:
            c = torch.cat([c, c.new_ones(*c.shape[:-1], 1)], dim=-1)
        c = plan.cols.dense(c)  # [B, T, k1]
        if isinstance(rep.A, OneHotFactor) and plan.blocks == 1 and plan.rows.kind != "gauss":
            return _token_rows(plan.rows, rep.A.tokens, c)
        a = _apply(plan.rows, rep.A, dtype)  # [B, T, k0]
        return _blocks(a, c, plan.blocks)

    def fold(self, key: str, sketch: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """One parameter's sketch [B, m] CountSketched into the shared vector [B, total] (added to
        ``out`` in place when given).  Seeded by (seed, key): the same in every batch."""
        total = self.spec.shared
        if total is None:
            raise ValueError("fold() needs a SketchSpec with a shared vector (total set, k <= total)")
        proj = self._folds.get(key)
        if proj is None or proj.n != sketch.shape[1]:
            proj = self._folds[key] = Projection(sketch.shape[1], total, "count", self.spec.seed, key, "fold")
        buckets, signs = proj._on(sketch.dtype, sketch.device)
        if out is None:
            out = sketch.new_zeros(sketch.shape[0], total)
        return out.index_add_(1, buckets, sketch * signs)

    def add(self, batch: SketchBatch, key: str, rep: Rep) -> None:
        """One contribution's sketch into ``batch``: under its key, or folded into the shared vector."""
        s = self.sketch(key, rep)
        if self.spec.shared is None:
            batch.add(key, s)
        elif SHARED in batch.parts:
            self.fold(key, s, batch.parts[SHARED])
        else:
            batch.add(SHARED, self.fold(key, s))

    def sketch_all(self, reps: dict[str, list[Rep]]) -> torch.Tensor:
        """[B, width] float64 sketches of every parameter's representations (uses summed), laid out as
        a window lays them out (benchmarks, tests)."""
        B = next(r for rs in reps.values() for r in rs).batch
        batch = SketchBatch(B)
        for key in sorted(reps):
            for r in reps[key]:
                self.add(batch, key, r)
        return batch.matrix(self.widths())

    def project_explicit(self, key: str, G: torch.Tensor) -> torch.Tensor:
        """Π g for explicit gradients G [B, n] in the representation's layout (``materialize()``):
        the definition the factor path must match (tests)."""
        plan = self._plans[key]
        if plan.cols is None:
            return G @ plan.rows.matrix(G.dtype)
        B, r = G.shape[0], plan.blocks
        G3 = G.reshape(B, plan.rows.n, plan.cols.n)
        RA, RC = plan.rows.matrix(G.dtype), plan.cols.matrix(G.dtype)
        RA, RC = RA.reshape(RA.shape[0], r, -1), RC.reshape(RC.shape[0], r, -1)
        return torch.einsum("iru,bij,jrv->bruv", RA, G3, RC).reshape(B, -1) * math.sqrt(r)

    def widths(self) -> dict[str, int]:
        """Sketch width of every parameter key seen so far (r blocks of s × s': r·s·s'), or
        {SHARED: total} when the sketches are folded into one shared vector."""
        if self.spec.shared is not None:
            return {SHARED: self.spec.shared}
        return {key: plan.rows.k * (1 if plan.cols is None else plan.cols.k // plan.blocks)
                for key, plan in self._plans.items()}


def _blocks(a: torch.Tensor, c: torch.Tensor, r: int) -> torch.Tensor:
    """Σ_t over positions of r Kronecker blocks a_tr c_trᵀ, [B, T, r·s] × [B, T, r·s'] -> [B, r·s·s'].
    Each side's entries are N(0, 1/(r·s)), so each block is scaled by √r to keep E‖Πg‖² = ‖g‖²."""
    B, T = a.shape[:2]
    if r == 1:  # one batched product (einsum copied its operands first: 5.0 -> 3.3 ms on a
        # 1,024-bucket × 256 head at B8 T64)
        return torch.bmm(a.transpose(1, 2), c).reshape(B, -1)
    out = torch.einsum("btru,btrv->bruv", a.reshape(B, T, r, -1), c.reshape(B, T, r, -1))
    return out.reshape(B, -1) * math.sqrt(r)


def _token_rows(rows: Projection, tokens: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``_blocks`` (r = 1) of an embedding's one-hot factor under a CountSketch or identity R: R's
    row for token v has one entry (bucket, sign), so Σ_t R[v_t]ᵀ c_t adds each position's signed c_t
    into its token's bucket: one index_add of B·T rows instead of a [B, T, k] one-hot and a
    product over it (vocabulary 8,192 → 1,024 buckets × 256 at B8 T64: 4.0 -> 2.0 ms)."""
    B, T, width = c.shape
    if rows.kind == "identity":
        bucket = tokens
    else:
        buckets, signs = rows._on(c.dtype, c.device)
        bucket, c = buckets[tokens], c * signs[tokens].unsqueeze(-1)
    where = bucket + torch.arange(B, device=c.device).unsqueeze(1) * rows.k
    out = c.new_zeros(B * rows.k, width)
    return out.index_add_(0, where.reshape(-1), c.reshape(B * T, width)).view(B, -1)


def _side(n: int, k: int | None, kind: str, seed: int, key: str, side: str) -> Projection:
    if k is None or n <= k:
        return Projection(n, n, "identity", seed, key, side)
    return Projection(n, k, kind, seed, key, side)


@dataclass
class SketchBatch:
    """The sketches of one batch, by parameter key (uses of one parameter summed)."""

    batch_size: int
    parts: dict[str, torch.Tensor] = field(default_factory=dict)

    def add(self, key: str, sketch: torch.Tensor) -> None:
        if sketch.shape[0] != self.batch_size:
            raise ValueError(f"a sketch of {sketch.shape[0]} rows for a batch of {self.batch_size}")
        self.parts[key] = self.parts[key] + sketch if key in self.parts else sketch

    def matrix(self, widths: dict[str, int] | None = None) -> torch.Tensor:
        """[B, m] float64: the parts side by side in the sorted order of ``widths``' keys
        (default: this batch's keys).  A key this batch never used is zeros (no gradient here)."""
        widths = widths or {k: v.shape[1] for k, v in self.parts.items()}
        device = next(iter(self.parts.values())).device if self.parts else torch.device("cpu")
        cols = [self.parts[k].to(torch.float64) if k in self.parts else
                torch.zeros(self.batch_size, widths[k], dtype=torch.float64, device=device)
                for k in sorted(widths)]
        if not cols:
            return torch.zeros(self.batch_size, 0, dtype=torch.float64)
        return torch.cat(cols, dim=1)


def vocab_keys(model: nn.Module, names: dict[int, str] | None = None) -> frozenset[str]:
    """Names of vocabulary-sized parameters: every nn.Embedding's weight and the output head's
    (``get_output_embeddings()`` of a Hugging Face model, tied or not)."""
    names = names or {id(p): n for n, p in model.named_parameters()}
    out = {names[id(m.weight)] for m in model.modules()
           if isinstance(m, nn.Embedding) and id(m.weight) in names}
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if head is not None and getattr(head, "weight", None) is not None and id(head.weight) in names:
        out.add(names[id(head.weight)])
    return frozenset(out)


def weight_matrices(model: nn.Module, vocab: frozenset[str], names: dict[int, str] | None = None) -> int:
    """How many weight matrices (trainable, ≥ 2 dimensions, not vocabulary-sized) the sketch's
    ``columns`` budget is shared by."""
    names = names or {id(p): n for n, p in model.named_parameters()}
    return sum(1 for p in model.parameters()
               if p.requires_grad and p.dim() >= 2 and names[id(p)] not in vocab)


def sketched_gnq(sketches: torch.Tensor, lam: float, weights: torch.Tensor | None = None,
                 *, check: bool = True) -> Solution:
    """GNQ from [B, m] sketches: the Gram of the sketches (rows divided by w_j first, as
    ``solve.unweight_kernel`` does for K) and the same leave-one-out solve as the exact path."""
    S = sketches.to(torch.float64)
    if weights is not None:
        w = weights.detach().to(device=S.device, dtype=torch.float64).reshape(-1, 1)
        S = S / w
    return gnq_from_kernel(S @ S.T, lam, check=check)
