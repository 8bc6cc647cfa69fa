"""Reference GNQ from explicit per-example gradients, for tests and small models.

Three independent ways to get the same numbers as ``GNQAuditor``:

* ``per_example_gradients_func``: torch.func ``grad`` of each example's own loss (a batch of
  one, re-run per example) — independent of the batch forward and of any hook.
* ``per_example_gradients``: one backward per example through a shared batch forward (sees the
  same dropout masks as the batch).
* ``naive_gnq``: the literal P×P definition (paper Alg. 2), and ``loo_gnq``, the leave-one-out
  solve in batch space; neither uses the Cholesky identity of ``gnq_core.engine.math.solve``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad
from torch.utils._pytree import tree_map

LossFn = Callable[[nn.Module, Any], torch.Tensor]  # (model, batch) -> per-example losses [B]


@dataclass
class ReferenceResult:
    gnq: torch.Tensor  # float64 [B]
    kernel: torch.Tensor  # float64 [B, B]
    gradients: torch.Tensor  # float64 [B, P]


def trainable_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def batch_size_of(batch: Any) -> int:
    sizes = set()
    tree_map(lambda t: sizes.add(t.shape[0]) if isinstance(t, torch.Tensor) else None, batch)
    if len(sizes) != 1:
        raise ValueError(f"batch tensors disagree on the batch size: {sorted(sizes)}")
    return sizes.pop()


def per_example_gradients_func(model: nn.Module, loss_fn: LossFn, batch: Any) -> torch.Tensor:
    """[B, P] float64: ∇θ ℓ_j by torch.func.grad on example j alone (a batch of one)."""
    params = trainable_parameters(model)
    wrapper = _LossModule(model, loss_fn)
    rows = []
    for j in range(batch_size_of(batch)):
        example = tree_map(lambda t, j=j: t[j:j + 1] if isinstance(t, torch.Tensor) else t, batch)

        def loss_j(p, example=example):
            losses = functional_call(wrapper, {f"model.{n}": v for n, v in p.items()}, (example,))
            if losses.shape != (1,):
                raise ValueError(f"loss_fn must return one loss per example, got {tuple(losses.shape)}")
            return losses[0]

        g = grad(loss_j)({n: p.detach() for n, p in params.items()})
        rows.append(torch.cat([g[n].reshape(-1).to(torch.float64) for n in params]))
    return torch.stack(rows)


class _LossModule(nn.Module):
    """model + loss_fn as one module, so functional_call can swap the model's parameters."""

    def __init__(self, model: nn.Module, loss_fn: LossFn):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, batch: Any) -> torch.Tensor:
        return self.loss_fn(self.model, batch)


def per_example_gradients(losses: torch.Tensor, params: Sequence[torch.Tensor]) -> torch.Tensor:
    """[B, P] float64: ∇θ ℓ_j by one backward per example through a shared forward graph."""
    params = list(params)
    rows = []
    for j in range(losses.shape[0]):
        gs = torch.autograd.grad(losses[j], params, retain_graph=True, allow_unused=True)
        rows.append(torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1)
                               .to(torch.float64) for g, p in zip(gs, params, strict=True)]))
    return torch.stack(rows)


def loo_gnq(G: torch.Tensor, lam: float) -> torch.Tensor:
    """GNQ_j = (K_jj − k_jᵀ (K_{-j} + λI)⁻¹ k_j) / λ, the leave-one-out solve per example."""
    G = G.to(torch.float64)
    K = G @ G.T
    B = K.shape[0]
    out = torch.empty(B, dtype=torch.float64)
    for j in range(B):
        rest = [k for k in range(B) if k != j]
        if not rest:
            out[j] = K[j, j] / lam
            continue
        k_j = K[rest, j]
        A = K[rest][:, rest] + lam * torch.eye(B - 1, dtype=torch.float64)
        out[j] = (K[j, j] - k_j @ torch.linalg.solve(A, k_j)) / lam
    return out


def naive_gnq(G: torch.Tensor, lam: float) -> torch.Tensor:
    """Paper Alg. 2, literally: form S_{-j} = Σ_{k≠j} g_k g_kᵀ + λI (P×P) and solve, per j."""
    G = G.to(torch.float64)
    B, P = G.shape
    eye = torch.eye(P, dtype=torch.float64)
    out = torch.empty(B, dtype=torch.float64)
    for j in range(B):
        rest = torch.cat([G[:j], G[j + 1:]])
        S = rest.T @ rest + lam * eye
        out[j] = G[j] @ torch.linalg.solve(S, G[j])
    return out


def exact_gnq(model: nn.Module, per_example_loss_fn: LossFn, batch: Any, lam: float,
              weights: torch.Tensor | None = None) -> ReferenceResult:
    """GNQ from explicit per-example gradients (torch.func), one example at a time.

    ``per_example_loss_fn(model, batch)`` returns the losses ℓ_j, shape [B].  ``weights`` are
    accepted for symmetry with ``GNQAuditor.compute`` and ignored: GNQ is defined on ℓ_j.
    """
    del weights
    G = per_example_gradients_func(model, per_example_loss_fn, batch)
    return ReferenceResult(gnq=loo_gnq(G, lam), kernel=G @ G.T, gradients=G)
