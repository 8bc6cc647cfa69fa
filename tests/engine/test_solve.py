"""K -> GNQ: the Cholesky solve against the literal P×P definition, at both extremes."""

from __future__ import annotations

import pytest
import torch
from conftest import TOL, rel_err

from gnq_core import GNQNumericalError
from gnq_core.engine import gnq_from_kernel
from gnq_core.engine.math.reference import loo_gnq, naive_gnq
from gnq_core.engine.math.solve import unweight_kernel


@pytest.mark.parametrize("lam", [1e-4, 1e-2, 1.0, 1e2])
@pytest.mark.parametrize("scale", [1e-3, 1.0])
def test_matches_literal_definition(lam, scale):
    torch.manual_seed(int(lam * 1e4 + scale * 7))
    G = torch.randn(6, 40) * scale
    got = gnq_from_kernel(G @ G.T, lam).gnq
    assert rel_err(got, naive_gnq(G, lam)) <= TOL
    assert rel_err(got, loo_gnq(G, lam)) <= TOL


def test_small_gnq_keeps_relative_precision():
    """GNQ ≪ 1 (large λ): 1/(λM_jj) − 1 would cancel to ~1e-10 relative error or to 0."""
    assert gnq_from_kernel(torch.tensor([[1e-17]]), 1.0).gnq.item() == pytest.approx(1e-17, rel=1e-15)
    torch.manual_seed(0)
    G = torch.randn(4, 50) * 1e-3
    got = gnq_from_kernel(G @ G.T, 100.0).gnq
    assert got.max() < 1e-6
    assert rel_err(got, naive_gnq(G, 100.0)) <= 1e-13


def test_large_gnq_is_not_clamped():
    """An example orthogonal to the others: GNQ = ‖g‖²/λ, far above the usual 1e6 cap."""
    G = torch.zeros(3, 5)
    G[0, 0], G[1, 1], G[2, 2] = 1.0, 2.0, 3.0
    got = gnq_from_kernel(G @ G.T, 1e-9).gnq
    assert rel_err(got, torch.tensor([1.0, 4.0, 9.0]) / 1e-9) <= TOL


def test_batch_of_one():
    assert gnq_from_kernel(torch.tensor([[4.0]]), 0.5).gnq.item() == pytest.approx(8.0, rel=1e-15)


def test_condition_number_reported():
    K = torch.diag(torch.tensor([3.0, 1.0]))
    assert gnq_from_kernel(K, 1.0).condition == pytest.approx(2.0)


def test_bad_kernels_are_clear_errors():
    with pytest.raises(GNQNumericalError, match="NaN/Inf"):
        gnq_from_kernel(torch.tensor([[1.0, float("nan")], [0.0, 1.0]]), 1.0)
    with pytest.raises(GNQNumericalError, match="not positive definite"):
        gnq_from_kernel(torch.tensor([[1.0, 0.0], [0.0, -5.0]]), 1.0)
    with pytest.raises(ValueError, match="lam"):
        gnq_from_kernel(torch.eye(2), 0.0)
    with pytest.raises(ValueError, match="square"):
        gnq_from_kernel(torch.ones(2, 3), 1.0)


def test_unweighting_recovers_per_example_kernel():
    torch.manual_seed(1)
    G = torch.randn(5, 9)
    w = torch.tensor([0.1, 0.2, 0.3, 0.25, 0.15])
    Kw = (w[:, None] * G) @ (w[:, None] * G).T
    assert rel_err(unweight_kernel(Kw, w), G @ G.T) <= TOL
    with pytest.raises(ValueError, match="entries"):
        unweight_kernel(Kw, w[:3])
