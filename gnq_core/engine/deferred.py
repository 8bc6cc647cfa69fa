"""Normalisation layers' per-example gradients, formed for all layers of one shape at once.

A LayerNorm's or RMSNorm's per-example gradients are cheap (B·T·d work) but, formed layer by
layer, cost a handful of small ops each — on a GPU, launches that outnumber the layer's own
backward.  So the auditor keeps each call's input, output gradient (and LayerNorm's saved
statistics) as a ``NormRecord`` until ``compute()``, where ``batched_per_example`` forms the
per-example gradients of every layer of one shape in one stacked computation:

    LayerNorm:  x̂ = (x − μ)·rstd,                        ∇w_j = Σ_t Δ_jt ⊙ x̂_jt, ∇b_j = Σ_t Δ_jt
    RMSNorm:    x̂ = (x·rsqrt(mean(x²) + ε)) in float32,  ∇w_j = Σ_t Δ_jt ⊙ x̂_jt  (Llama's formula)

The records held at once are bounded by the auditor's memory budget (bytes); past it, a layer's
gradients are formed at once as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gnq_core.engine.representations import compute_dtype


def _seq(t: torch.Tensor, B: int, width: int | None = None) -> torch.Tensor:
    """[B, ..., d] as [B, T, width] (default: the last dim; no op when it already is that)."""
    width = t.shape[-1] if width is None else width
    return t if t.dim() == 3 and t.shape[-1] == width else t.reshape(B, -1, width)


@dataclass
class NormRecord:
    """One call of a normalisation layer: what its per-example parameter gradients need."""

    kind: str  # "layer" or "rms"
    x: torch.Tensor  # [B, T, d] input
    dy: torch.Tensor  # [B, T, d] output gradient
    mean: torch.Tensor | None  # LayerNorm's saved statistics [B, T, 1]
    rstd: torch.Tensor | None
    eps: float  # RMSNorm's ε
    weight: bool  # which parameters get gradients
    bias: bool

    @classmethod
    def layer_norm(cls, x: torch.Tensor, dy: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                   width: int, weight: bool, bias: bool) -> NormRecord:
        """``width``: the number of normalised elements (the normalised dims may be several)."""
        B = x.shape[0]
        return cls("layer", _seq(x, B, width), _seq(dy, B, width), _seq(mean, B, 1), _seq(rstd, B, 1),
                   0.0, weight, bias)

    @classmethod
    def rms_norm(cls, x: torch.Tensor, dy: torch.Tensor, eps: float) -> NormRecord:
        B = x.shape[0]
        return cls("rms", _seq(x, B), _seq(dy, B), None, None, eps, True, False)

    @property
    def key(self) -> tuple:
        """Records with the same key are stacked into one computation."""
        return (self.kind, self.x.shape, self.x.dtype, self.dy.dtype, self.x.device, self.eps,
                self.weight, self.bias)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.x, self.dy, self.mean, self.rstd)
                   if t is not None)

    def per_example(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """This call's per-example gradients ([B, d] or None for weight and bias)."""
        return _per_example(self.kind, self.x, self.dy, self.mean, self.rstd, self.eps, self.weight,
                            self.bias, dim=1)


def _per_example(kind: str, x, dy, mean, rstd, eps: float, weight: bool, bias: bool, dim: int):
    dtype = compute_dtype(dy)
    D = dy if dy.dtype == dtype else dy.to(dtype)
    per_w = per_b = None
    if weight:
        if kind == "layer":
            x_hat = (x - mean) * rstd
        else:  # exactly LlamaRMSNorm's forward (in float32, then back to the input's dtype)
            h = x.to(torch.float32)
            x_hat = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
        per_w = (D * (x_hat if x_hat.dtype == dtype else x_hat.to(dtype))).sum(dim)
    if bias:
        per_b = D.sum(dim)
    return per_w, per_b


def batched_per_example(records: list[NormRecord]) -> torch.Tensor:
    """Per-example gradients of all ``records`` (one key), [B, Σ widths], in one stacked pass."""
    first = records[0]
    B = first.x.shape[0]

    def stack(name: str) -> torch.Tensor | None:
        parts = [getattr(r, name) for r in records]
        return None if parts[0] is None else torch.stack(parts)

    per_w, per_b = _per_example(first.kind, stack("x"), stack("dy"), stack("mean"), stack("rstd"),
                                first.eps, first.weight, first.bias, dim=2)  # [L, B, d] each
    parts = [t for t in (per_w, per_b) if t is not None]
    joint = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
    return joint.transpose(0, 1).reshape(B, -1)


def group(records: list[NormRecord]) -> list[list[NormRecord]]:
    """Records by key, in first-seen order."""
    groups: dict[tuple, list[NormRecord]] = {}
    for r in records:
        groups.setdefault(r.key, []).append(r)
    return list(groups.values())


@dataclass
class NormRep:
    """A normalisation layer's per-example gradients, still as its ``NormRecord`` (weight and
    bias jointly, [B, d_w + d_b] once formed): the auditor defers it or materialises it."""

    record: NormRecord

    @property
    def batch(self) -> int:
        return self.record.x.shape[0]

    def materialize(self) -> torch.Tensor:
        parts = [t for t in self.record.per_example() if t is not None]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
