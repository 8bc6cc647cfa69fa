"""gnq_core.analysis.regression2d: the numpy maths behind the dashboard's 2D regression (paper §4) page."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gnq_core.analysis import regression2d as r2

LAMS = [1e-6, 1e-2, 1.0, 100.0]
X, Y, W, B = r2.DEFAULT_X, r2.DEFAULT_Y, r2.DEFAULT_W, r2.DEFAULT_B
SETTINGS = settings(max_examples=60, deadline=None)


def default_G() -> np.ndarray:
    return r2.gradients(X, Y, W, B)


def direct_gnq(G: np.ndarray, lam: float) -> np.ndarray:
    """The definition, per j: solve the 2×2 system S_{−j} u = g_j, GNQ_j = g_jᵀ u."""
    return np.array([G[j] @ np.linalg.solve(r2.leave_one_out_matrix(G, j, lam), G[j]) for j in range(len(G))])


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300)))


def leverage_example() -> tuple[np.ndarray, np.ndarray]:
    """The six inliers, two 'twin' points with residual 0.6 at x ≈ 0.3 (loss 0.18 each, but each
    one's gradient is echoed by the other) and a far-out point at x = 6 with residual 0.25 (loss
    0.03, but a gradient direction nobody else has)."""
    x = np.r_[X[:6], 0.3, 0.35, 6.0]
    res = np.r_[r2.residuals(X[:6], Y[:6], W, B), 0.6, 0.6, 0.25]
    return x, W * x + B + res


# --- data and gradients -------------------------------------------------------------------


def test_defaults():
    assert X.shape == Y.shape == (7,) and X.dtype == Y.dtype == np.float64
    # DEFAULT_W, DEFAULT_B is the least-squares fit of the six inliers: their gradients sum to 0
    G = default_G()
    inliers = np.delete(G, r2.DEFAULT_OUTLIER, axis=0)
    assert np.allclose(inliers.sum(0), 0.0, atol=1e-12)
    assert abs(r2.residuals(X, Y, W, B)[r2.DEFAULT_OUTLIER]) > 2.0


def test_residuals_losses_gradients_by_hand():
    x, y, w, b = np.array([1.0, -2.0]), np.array([3.0, 0.5]), 2.0, -1.0
    r = r2.residuals(x, y, w, b)
    assert np.array_equal(r, np.array([2.0, 5.5]))
    assert np.array_equal(r2.losses(x, y, w, b), r**2 / 2)
    assert np.array_equal(r2.gradients(x, y, w, b), np.array([[-2.0, -2.0], [11.0, -5.5]]))
    with pytest.raises(ValueError):
        r2.residuals(np.zeros(3), np.zeros(2), w, b)


@pytest.mark.parametrize("wb", [(W, B), (1.5, 0.5), (-0.3, 2.0)])
def test_gradients_match_autograd(wb):
    w0, b0 = wb
    x, y = torch.tensor(X), torch.tensor(Y)
    rows = []
    for j in range(len(X)):
        w = torch.tensor(w0, requires_grad=True)
        b = torch.tensor(b0, requires_grad=True)
        loss = 0.5 * (y[j] - (w * x[j] + b)) ** 2
        gw, gb = torch.autograd.grad(loss, (w, b))
        rows.append([gw.item(), gb.item()])
    auto = np.array(rows)
    assert auto.dtype == np.float64
    np.testing.assert_allclose(r2.gradients(X, Y, w0, b0), auto, rtol=1e-14, atol=1e-15)
    # ∂ℓ/∂b = −r: the loss strip is a strip in the b-coordinate of gradient space
    np.testing.assert_allclose(auto[:, 1], -r2.residuals(X, Y, w0, b0), rtol=1e-14)


# --- GNQ ----------------------------------------------------------------------------------


def test_leave_one_out_matrix():
    G = default_G()
    S = r2.leave_one_out_matrix(G, 2, 0.5)
    expected = sum(np.outer(G[k], G[k]) for k in range(len(G)) if k != 2) + 0.5 * np.eye(2)
    np.testing.assert_allclose(S, expected, rtol=1e-14)
    np.testing.assert_allclose(r2.leave_one_out_matrix(G, -1, 0.5), r2.leave_one_out_matrix(G, 6, 0.5))
    with pytest.raises(IndexError):
        r2.leave_one_out_matrix(G, 7, 0.5)


@pytest.mark.parametrize("lam", LAMS)
@pytest.mark.parametrize("wb", [(W, B), (1.5, 0.5), (2.0604, 1.4286)])
def test_gnq_batch_space_matches_direct(lam, wb):
    G = r2.gradients(X, Y, *wb)
    assert rel(r2.gnq(G, lam), direct_gnq(G, lam)) <= 1e-12


@pytest.mark.parametrize("lam", [1e-2, 1.0, 100.0])
def test_gnq_is_the_literal_batch_formula(lam):
    """K = G Gᵀ, M = (K + λI)⁻¹, h = diag(K M), GNQ = h / (λ M_jj), written out (well
    conditioned for these λ; at λ = 1e-6 the literal inverse loses ~cond(K + λI)·ε)."""
    G = default_G()
    K = G @ G.T
    M = np.linalg.inv(K + lam * np.eye(len(G)))
    literal = np.diag(K @ M) / (lam * np.diag(M))
    assert rel(r2.gnq(G, lam), literal) <= 1e-11


def test_gnq_edge_cases():
    G = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 0.0]])  # a zero gradient and a duplicate pair
    q = r2.gnq(G, 0.1)
    assert q[1] == 0.0
    assert rel(q, direct_gnq(G, 0.1)) <= 1e-12
    assert np.isclose(q[0], 1 / 1.1) and q[0] < 1  # a duplicate is inside the other's ellipse
    assert r2.gnq(np.array([[3.0, 4.0]]), 5.0)[0] == pytest.approx(25 / 5)  # alone: |g|²/λ
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError):
            r2.gnq(G, bad)


@pytest.mark.parametrize("lam", LAMS)
def test_outlier_has_highest_gnq(lam):
    q = r2.gnq(default_G(), lam)
    order = np.argsort(-q)
    assert order[0] == r2.DEFAULT_OUTLIER
    assert q[order[0]] > 10 * q[order[1]]


@pytest.mark.parametrize("lam", [1e-12, 1e-6, 1e-2, 1.0])
def test_only_the_outlier_is_outside(lam):
    flagged = r2.gnq(default_G(), lam) > 1
    assert np.flatnonzero(flagged).tolist() == [r2.DEFAULT_OUTLIER]


# --- ellipse, strip -----------------------------------------------------------------------


@pytest.mark.parametrize("lam", LAMS)
@pytest.mark.parametrize("j", [0, 3, 6])
def test_ellipse_points_on_level_set(lam, j):
    S = r2.leave_one_out_matrix(default_G(), j, lam)
    pts = r2.ellipse(S, n=200)
    assert pts.shape == (200, 2)
    level = np.einsum("ni,ij,nj->n", pts, np.linalg.inv(S), pts)
    np.testing.assert_allclose(level, 1.0, rtol=0, atol=1e-10)
    np.testing.assert_allclose(pts[0], pts[-1], atol=1e-12)  # closed curve for plotting


def test_ellipse_rejects_bad_matrices():
    with pytest.raises(ValueError):
        r2.ellipse(np.array([[1.0, 0.0], [0.0, -1.0]]))
    with pytest.raises(ValueError):
        r2.ellipse(np.array([[1.0, 0.5], [0.0, 1.0]]))
    with pytest.raises(ValueError):
        r2.ellipse(np.eye(3))


@pytest.mark.parametrize("lam", LAMS)
def test_inside_ellipse_iff_gnq_at_most_one(lam):
    for x, y, w, b in [(X, Y, W, B), (X, Y, 1.5, 0.5), (*leverage_example(), W, B)]:
        G = r2.gradients(x, y, w, b)
        q = r2.gnq(G, lam)
        for j in range(len(G)):
            assert r2.inside_ellipse(G[j], r2.leave_one_out_matrix(G, j, lam)) == (q[j] <= 1)
    S = np.diag([4.0, 1.0])
    assert r2.inside_ellipse(np.array([2.0, 0.0]), S)  # on the boundary counts as inside
    assert not r2.inside_ellipse(np.array([0.0, 1.001]), S)


def test_loss_strip():
    assert r2.loss_strip_halfwidth(0.0) == 0.0
    assert r2.loss_strip_halfwidth(2.0) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        r2.loss_strip_halfwidth(-1.0)
    tau = 0.004
    half = r2.loss_strip_halfwidth(tau)
    G, loss = default_G(), r2.losses(X, Y, W, B)
    assert np.array_equal(np.abs(G[:, 1]) <= half, loss <= tau)


# --- rankings -----------------------------------------------------------------------------

COLUMNS = ["index", "x", "y", "residual", "loss", "gnq", "gnq_rank", "loss_rank", "flagged_by_loss",
           "flagged_by_gnq"]


def test_rankings_columns_and_values():
    df = r2.rankings(X, Y, W, B, lam=1e-2, tau=0.5)
    assert set(COLUMNS) <= set(df.columns)
    assert len(df) == 7 and df["index"].tolist() == list(range(7))
    np.testing.assert_allclose(df["gnq"], r2.gnq(default_G(), 1e-2))
    np.testing.assert_allclose(df["loss"], r2.losses(X, Y, W, B))
    assert sorted(df["gnq_rank"]) == list(range(1, 8))
    assert df.loc[df["gnq_rank"] == 1, "index"].item() == r2.DEFAULT_OUTLIER
    assert df.loc[df["loss_rank"] == 1, "index"].item() == r2.DEFAULT_OUTLIER
    assert df.sort_values("gnq_rank")["index"].tolist() == np.argsort(-df["gnq"].to_numpy()).tolist()
    assert df["flagged_by_gnq"].tolist() == [i == r2.DEFAULT_OUTLIER for i in range(7)]
    assert df["flagged_by_loss"].tolist() == [i == r2.DEFAULT_OUTLIER for i in range(7)]
    assert df["flagged_by_gnq"].dtype == bool and df["gnq_rank"].dtype.kind == "i"


def test_flagged_by_gnq_not_by_loss_default_data():
    """On the default data the outlier also has the largest loss, so GNQ-but-not-loss needs
    τ at or above its loss (≈ 4.5): then the loss flags nothing while GNQ still flags it."""
    tau = float(r2.losses(X, Y, W, B).max())
    df = r2.rankings(X, Y, W, B, lam=1e-2, tau=tau)
    row = df.loc[r2.DEFAULT_OUTLIER]
    assert row["flagged_by_gnq"] and not row["flagged_by_loss"]


@pytest.mark.parametrize("lam", [1e-6, 1e-2, 1.0])
def test_loss_and_gnq_disagree_both_ways(lam):
    """The leverage example at τ = 0.1: the far-out point (loss 0.03) is flagged by GNQ only,
    the two twin points (loss 0.18) by the loss only."""
    x, y = leverage_example()
    df = r2.rankings(x, y, W, B, lam=lam, tau=0.1)
    lever, twins = 8, [6, 7]
    assert df.loc[lever, "flagged_by_gnq"] and not df.loc[lever, "flagged_by_loss"]
    assert df.loc[lever, "gnq_rank"] == 1 and df.loc[lever, "loss_rank"] == 3
    for t in twins:
        assert df.loc[t, "flagged_by_loss"] and not df.loc[t, "flagged_by_gnq"]
        assert df.loc[t, "loss_rank"] == 1  # tied
    assert df["flagged_by_gnq"].sum() == 1 and df["flagged_by_loss"].sum() == 2


# --- parse_points -------------------------------------------------------------------------


def test_parse_points_happy_path():
    text = "# x, y\n1, 2\n\n  -0.5;3e-1 \n4\t5\n6 7.25\n"
    x, y = r2.parse_points(text)
    assert x.dtype == y.dtype == np.float64
    assert x.tolist() == [1.0, -0.5, 4.0, 6.0]
    assert y.tolist() == [2.0, 0.3, 5.0, 7.25]
    lines = "\n".join(f"{a}, {b}" for a, b in zip(X, Y, strict=True))
    x, y = r2.parse_points(lines)
    assert np.array_equal(x, X) and np.array_equal(y, Y)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("1, 2\n3, 4, 5\n", "line 2"),
        ("1, 2\nfoo, 4\n", "line 2"),
        ("1, 2\n3\n", "line 2"),
        ("1, 2\n\n3,,4\n", "line 3"),
        ("1, nan\n3, 4\n", "line 1"),
        ("1, 2\n3, inf\n", "line 2"),
        ("1, 2\n", "at least 2"),
        ("", "at least 2"),
        ("# nothing\n\n", "at least 2"),
    ],
)
def test_parse_points_errors(text, match):
    with pytest.raises(ValueError, match=match) as err:
        r2.parse_points(text)
    assert "\n" not in str(err.value)


# --- properties ---------------------------------------------------------------------------

grad_rows = hnp.arrays(
    np.float64,
    st.tuples(st.integers(2, 8), st.just(2)),
    elements=st.floats(-10, 10, allow_nan=False, allow_infinity=False),
)


@SETTINGS
@given(G=grad_rows, lam=st.floats(1e-3, 1e2), c=st.floats(0.05, 20), seed=st.integers(0, 2**32 - 1))
def test_gnq_permutation_and_scale_invariance(G, lam, c, seed):
    q = r2.gnq(G, lam)
    scale = 1e-10 * (1.0 + np.abs(q).max())
    perm = np.random.default_rng(seed).permutation(len(G))
    np.testing.assert_allclose(r2.gnq(G[perm], lam), q[perm], rtol=1e-9, atol=scale)
    np.testing.assert_allclose(r2.gnq(c * G, c * c * lam), q, rtol=1e-9, atol=scale)
    np.testing.assert_allclose(q, direct_gnq(G, lam), rtol=1e-9, atol=scale)
    assert (q >= 0).all()
