"""Properties GNQ must have, checked with hypothesis on a small MLP (6-5-3, tanh).

Conditioning: P = 6·5 + 5 + 5·3 + 3 = 53 parameters and at most 8 examples, so per-example
gradients are linearly independent and K + λI stays well conditioned.  Targets are drawn
with scale 3, so every residual — hence ‖g_j‖², which is at least the output-bias part
‖r_j‖² — is O(1..10); with λ ≤ 1e2 every GNQ is ≳ 1e-3, far from the regime where
1/(λM_jj) − 1 cancels (relative error ≈ 1e-16 / GNQ).  All comparisons then hold to TOL.
"""

from __future__ import annotations

import math

import torch
from conftest import PATHS, TOL, kernel_err, rel_err
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from gnq_core import GNQAuditor, exact_gnq

SETTINGS = settings(max_examples=25, deadline=None)
seeds = st.integers(min_value=0, max_value=2**31 - 1)
paths = st.sampled_from(PATHS)


def log_uniform(lo: float, hi: float) -> st.SearchStrategy[float]:
    """10**e with e uniform in [log10 lo, log10 hi]."""
    return st.floats(min_value=math.log10(lo), max_value=math.log10(hi)).map(lambda e: 10.0**e)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return 0.5 * (model(x) - y).pow(2).sum(-1)


def setup(seed: int, B: int):
    torch.manual_seed(seed)
    model = mlp()
    x = torch.randn(B, 6)
    y = 3.0 * torch.randn(B, 3)
    return model, (x, y)


def run(auditor: GNQAuditor, model: nn.Module, batch, scale: float = 1.0, weights=None):
    """One training step's backward through the auditor: Σ_j w_j·(scale·ℓ_j)."""
    model.zero_grad(set_to_none=True)
    losses = scale * loss_fn(model, batch)
    (losses if weights is None else losses * weights).sum().backward()
    return auditor.compute(weights=weights)


@SETTINGS
@given(seed=seeds, B=st.integers(2, 8), path=paths, lam=log_uniform(1e-3, 1e1), data=st.data())
def test_permuting_the_batch_permutes_gnq(seed, B, path, lam, data):
    perm = torch.tensor(data.draw(st.permutations(range(B))))
    model, (x, y) = setup(seed, B)
    with GNQAuditor(model, lam=lam, path=path) as auditor:
        res = run(auditor, model, (x, y))
        res_perm = run(auditor, model, (x[perm], y[perm]))
    assert rel_err(res_perm.gnq, res.gnq[perm]) <= TOL
    assert kernel_err(res_perm.kernel, res.kernel[perm][:, perm]) <= TOL


@SETTINGS
@given(seed=seeds, B=st.integers(1, 8), path=paths, lam=log_uniform(1e-3, 1e1),
       c=log_uniform(1e-3, 1e3))
def test_scaling_gradients_and_lambda_leaves_gnq_unchanged(seed, B, path, lam, c):
    """g → c·g and λ → c²·λ: GNQ is a ratio of ‖g‖² to λ, so it does not move."""
    model, batch = setup(seed, B)
    with GNQAuditor(model, lam=lam, path=path) as auditor:
        res = run(auditor, model, batch)
    with GNQAuditor(model, lam=lam * c**2, path=path) as auditor:
        res_c = run(auditor, model, batch, scale=c)
    assert kernel_err(res_c.kernel, c**2 * res.kernel) <= TOL
    assert rel_err(res_c.gnq, res.gnq) <= TOL
    # not vacuous: scaling the gradients alone (λ kept) does change GNQ
    with GNQAuditor(model, lam=lam, path=path) as auditor:
        res_g = run(auditor, model, batch, scale=c)
    if abs(c - 1) > 1e-3:
        assert rel_err(res_g.gnq, res.gnq) > 1e-6


@SETTINGS
@given(seed=seeds, B=st.integers(1, 6), path=paths, lam=log_uniform(1e-2, 1e1), data=st.data())
def test_duplicating_an_example_lowers_its_gnq(seed, B, path, lam, data):
    """With a copy of g_j in S_{-j}, GNQ_j = a/(1 + a) < a (Sherman–Morrison), a = GNQ_j alone."""
    j = data.draw(st.integers(0, B - 1))
    model, (x, y) = setup(seed, B)
    x_dup = torch.cat([x, x[j:j + 1]])
    y_dup = torch.cat([y, y[j:j + 1]])
    with GNQAuditor(model, lam=lam, path=path) as auditor:
        a = run(auditor, model, (x, y)).gnq[j]
        dup = run(auditor, model, (x_dup, y_dup)).gnq
    assert dup[j] < a and dup[B] < a
    assert abs(dup[j] - dup[B]) <= TOL * dup[j]  # the two copies are indistinguishable
    # Two equal rows give K + λI an eigenvalue ≈ λ, so its condition number is ‖K‖/λ (up to
    # ~4e2/λ here) and the solve's relative error is ≈ 1e-16·‖K‖/λ: λ ≥ 1e-2 keeps that at
    # ≲ 1e-11, 100× inside TOL (at λ = 1e-3 errors of 6e-11 were seen).
    assert abs(dup[j] - a / (1 + a)) <= TOL * dup[j]


@SETTINGS
@given(seed=seeds, B=st.integers(1, 8), path=paths, lam=log_uniform(1e-6, 1e2),
       mean=st.booleans())
def test_auditor_matches_exact_gnq(seed, B, path, lam, mean):
    model, batch = setup(seed, B)
    ref = exact_gnq(model, loss_fn, batch, lam)
    weights = torch.full((B,), 1.0 / B) if mean else None
    with GNQAuditor(model, lam=lam, path=path) as auditor:
        res = run(auditor, model, batch, weights=weights)
    assert res.gnq.shape == (B,) and res.gnq.dtype == torch.float64
    assert (res.gnq > 0).all()
    assert rel_err(res.gnq, ref.gnq) <= TOL
    assert kernel_err(res.kernel, ref.kernel) <= TOL


@SETTINGS
@given(seed=seeds, path=paths, lam=log_uniform(1e-6, 1e2))
def test_single_example_gnq_is_norm_over_lambda(seed, path, lam):
    """B = 1: S_{-j} = λI, so GNQ = ‖g‖²/λ."""
    model, batch = setup(seed, 1)
    g = exact_gnq(model, loss_fn, batch, lam).gradients[0]
    with GNQAuditor(model, lam=lam, path=path) as auditor:
        res = run(auditor, model, batch)
    expected = (g @ g) / lam
    assert rel_err(res.gnq, expected.reshape(1)) <= TOL
    # and the gradient the reference differentiated is the one training sees
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    torch.testing.assert_close(flat, g, rtol=1e-12, atol=1e-14)
