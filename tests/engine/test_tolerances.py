"""Exactness tolerances derived from the problem (gnq_core.engine.math.tolerance), not fixed: an honest
difference passes on any machine, a real error (a dropped or mis-scaled term) fails.

A fixed 1e-9 failed `kolibri1` on another CPU (2.66e-9): that family computes its norms, softmax
and router in float32 inside a float64 model, and a per-example replay at another batch shape sums
them in another order there.  The model below does the same on purpose (float rounding whose grid
depends on the batch's shape), so this machine shows what that one did.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gnq_core import GNQAuditor
from gnq_core.engine.math.reference import loo_gnq, per_example_gradients
from gnq_core.engine.math.solve import gnq_from_kernel
from gnq_core.engine.math.tolerance import exactness, gamma, kernel_bound, kernel_noise, unit_roundoff

LAM = 1e-2


def test_an_honest_gram_in_another_order_is_within_its_bound():
    """K summed in another order (reversed blocks of the P-long reduction) differs from G Gᵀ by
    rounding, always within 16 γ_P of max|K|; four of the 40,000 terms dropped is not."""
    g = torch.Generator().manual_seed(0)
    G = torch.randn(5, 40_000, generator=g) * torch.logspace(-3, 3, 40_000)  # entries of every size
    K = G @ G.T
    blocks = torch.stack([G[:, i:i + 997] @ G[:, i:i + 997].T for i in range(0, G.shape[1], 997)])
    other = blocks.flip(0).sum(0)
    bound = kernel_bound(G.shape[1])
    assert bound == pytest.approx(16 * gamma(40_000, unit_roundoff()))
    assert ((other - K).abs().max() / K.abs().max()).item() <= bound
    dropped = K - G[:, -4:] @ G[:, -4:].T
    assert ((dropped - K).abs().max() / K.abs().max()).item() > 100 * bound


def test_an_ill_conditioned_solve_gets_the_room_its_conditioning_needs():
    """Near-copies (GNQ_j ≪ K_jj/λ: cancellation) at a small λ: the reference's leave-one-out solves
    and the engine's Cholesky identity honestly differ by more than a fixed 1e-9, within the bound
    derived from the solve's conditioning; the same bound fails a kernel mis-scaled by 1e-6."""
    g = torch.Generator().manual_seed(1)
    base = torch.randn(1, 3000, generator=g)
    G = torch.cat([base + 1e-4 * torch.randn(3, 3000, generator=g), torch.randn(2, 3000, generator=g)])
    lam = 1e-7
    K = G @ G.T
    reference = loo_gnq(G, lam)
    engine = gnq_from_kernel(K, lam, check=False).gnq
    honest = exactness(K, engine, K, reference, lam, G.shape[1])
    assert honest.error > 1e-9  # a fixed tolerance would call this honest difference an error
    assert honest.ok, honest.describe()
    wrong = K * (1 + 1e-6)
    assert not exactness(wrong, gnq_from_kernel(wrong, lam, check=False).gnq, K, reference, lam,
                         G.shape[1]).ok


class ShapeRounding(nn.Module):
    """A float64 layer whose own arithmetic rounds at a grid set by the batch's shape (its first
    dimension), as a float32 part of a model summed by a BLAS in a shape-dependent order does:
    the batch's forward and a per-example replay (the generic kernel, under vmap) round differently."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d, d) / d**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x @ self.weight
        step = 2.0**-26 * x.shape[0]
        h = h + (torch.round(h / step) * step - h).detach()  # the value rounded, the gradient kept
        return torch.tanh(h)


def _losses(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y, reduction="none")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_model_that_rounds_by_shape_passes_and_a_dropped_term_still_fails(seed):
    torch.manual_seed(seed)
    d, B = 8, 6
    model = nn.Sequential(nn.Linear(d, d), ShapeRounding(d), nn.Linear(d, 5))
    x, y = torch.randn(B, d), torch.randint(0, 5, (B,))
    params = list(model.parameters())
    P = sum(p.numel() for p in params)
    G = per_example_gradients(_losses(model, x, y), params)
    K, gnq = G @ G.T, loo_gnq(G, LAM)
    with GNQAuditor(model, lam=LAM) as auditor:
        _losses(model, x, y).sum().backward()
        res = auditor.compute()
    a_priori = exactness(res.kernel, res.gnq, K, gnq, LAM, P)
    assert not a_priori.ok  # float64's own bound cannot hold: the model rounds coarser
    alone = torch.cat([per_example_gradients(_losses(model, x[j:j + 1], y[j:j + 1]), params)
                       for j in range(B)])
    noise = kernel_noise(G, alone)
    assert noise > 0
    measured = exactness(res.kernel, res.gnq, K, gnq, LAM, P, noise=noise)
    assert measured.ok, measured.describe()
    # the auditor without the middle layer's weight (a dropped term), under the same bound
    sizes = [p.numel() for p in params]
    start = sum(sizes[:2])
    part = G[:, start:start + sizes[2]]
    dropped = res.kernel - part @ part.T
    assert not exactness(dropped, gnq_from_kernel(dropped, LAM).gnq, K, gnq, LAM, P, noise=noise).ok


def test_the_family_matrix_judges_by_the_derived_bound_and_fails_a_dropped_term():
    """tests/families.py's cells use the derived bound: gpt2 and kolibri1 (float32 norms, softmax
    and router: the family that failed on another CPU) are exact on every path here; a kernel
    without the output layer's bias term, or mis-scaled by 1e-7, is not."""
    import families

    for family in ("gpt2", "kolibri1"):
        task = families.families()[family]
        model = families.build(family, task)
        cells = families.check(model, family, task)
        assert all(c.exact for c in cells), [c.detail for c in cells]
    cond = families.condition("gpt2")
    model = families.build("gpt2", "causal")
    inputs = families.batch("causal", 0, cond)
    model.train(cond.train)
    params = [p for p in model.parameters() if p.requires_grad]
    G = per_example_gradients(families.losses(model, "causal", inputs), params)
    K, gnq = G @ G.T, loo_gnq(G, LAM)
    last = params[-1].numel()  # the final norm's bias
    for wrong in (K - G[:, -last:] @ G[:, -last:].T, K * (1 + 1e-7)):
        result = exactness(wrong, gnq_from_kernel(wrong, LAM).gnq, K, gnq, LAM, G.shape[1])
        assert not result.ok, result.describe()
