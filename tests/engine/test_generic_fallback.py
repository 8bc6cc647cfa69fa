"""The generic kernel's plain-autograd fallback (``kernels.generic._autograd_vjp``): a module whose
forward runs an autograd.Function torch.func cannot transform (no ``setup_context``, like
RecurrentGemma's) gets exact per-example gradients, per example and by the dropout replay."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gnq_core.engine.auditor import GNQAuditor
from gnq_core.engine.math.reference import loo_gnq, per_example_gradients


class _ScaleBySquare(torch.autograd.Function):
    """y = x ⊙ w² (old-style: forward takes ctx, so torch.func refuses it)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w * w, (g * 2 * x * w).reshape(-1, w.shape[0]).sum(0)


class _Custom(nn.Module):
    def __init__(self, width: int, dropout: float) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(width))
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return self.drop(_ScaleBySquare.apply(x, self.w))


@pytest.mark.parametrize("dropout", [0.0, 0.3], ids=["per-example", "replayed"])
def test_an_untransformable_autograd_function_is_exact(dropout):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, 6), _Custom(6, dropout), nn.Tanh(), nn.Linear(6, 3)).double()
    x, y = torch.randn(7, 5, dtype=torch.float64), torch.randint(0, 3, (7,))
    params = list(model.parameters())
    with GNQAuditor(model, lam=1e-3, fused=False) as auditor:
        losses = nn.functional.cross_entropy(model(x), y, reduction="none")
        with auditor.paused():  # the reference's backwards through the same forward (same masks)
            G = per_example_gradients(losses, params)
        losses.sum().backward()
        res = auditor.compute()
    assert res.coverage.entries[1].kernel == "generic-vjp"
    torch.testing.assert_close(res.kernel, G @ G.T, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(res.gnq, loo_gnq(G, 1e-3), rtol=1e-8, atol=0)
