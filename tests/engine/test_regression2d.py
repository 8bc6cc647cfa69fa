"""The paper's §4 example: 2D linear regression, seven points, one outlier.

Model y = w·x + b (nn.Linear(1, 1)), squared loss ℓ_j = ½ (w x_j + b − y_j)², so
g_j = r_j·[x_j, 1] with the residual r_j = w x_j + b − y_j.  With P = 2 the literal P×P
definition GNQ_j = g_jᵀ (Σ_{k≠j} g_k g_kᵀ + λI)⁻¹ g_j is cheap, and every route to GNQ must
agree: a closed-form 2×2 inverse, ``naive_gnq`` (P×P solve), ``loo_gnq`` (batch-space
leave-one-out solve), ``exact_gnq`` (torch.func gradients) and the auditor (hooks).
"""

from __future__ import annotations

import pytest
import torch
from conftest import PATHS, TOL, kernel_err, rel_err
from torch import nn

from gnq_core import GNQAuditor, exact_gnq
from gnq_core.engine.math.reference import loo_gnq, naive_gnq

# Six points scattered around y = 2x + 1, and point 7 (index 6) far above the line, with an
# x in the middle of the range: its *direction* [x, 1] is unremarkable, only its residual is.
X = [-2.0, -1.2, -0.5, 0.4, 1.1, 1.9, 0.3]
Y = [-2.9, -1.5, 0.1, 1.7, 3.3, 4.7, 4.6]
OUTLIER = 6
# A fixed parameter point that is not the least-squares fit (of all points or of the inliers),
# so every residual is non-zero and the inlier residuals are not just noise.
W, B = 1.5, 0.5
LAMS = [1e-3, 1e-2, 1e-1, 1.0, 10.0]


def data() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(X).unsqueeze(1), torch.tensor(Y).unsqueeze(1)


def make_model() -> nn.Linear:
    model = nn.Linear(1, 1)
    with torch.no_grad():
        model.weight.fill_(W)
        model.bias.fill_(B)
    return model


def squared_loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return 0.5 * (model(x) - y).squeeze(1).pow(2)


def hand_gradients() -> torch.Tensor:
    """[7, 2]: g_j = r_j·[x_j, 1], columns in nn.Linear's parameter order (weight, bias)."""
    x, y = torch.tensor(X), torch.tensor(Y)
    r = W * x + B - y
    return torch.stack([r * x, r], dim=1)


def closed_form_gnq(G: torch.Tensor, lam: float) -> torch.Tensor:
    """g_jᵀ S⁻¹ g_j with the 2×2 inverse written out: S⁻¹ = [[d, −b], [−b, a]] / (ad − b²)."""
    out = []
    for j in range(G.shape[0]):
        rest = torch.cat([G[:j], G[j + 1:]])
        a = (rest[:, 0] ** 2).sum() + lam
        d = (rest[:, 1] ** 2).sum() + lam
        b = (rest[:, 0] * rest[:, 1]).sum()
        u, v = G[j]
        out.append((d * u * u - 2 * b * u * v + a * v * v) / (a * d - b * b))
    return torch.stack(out)


def audit(path: str, lam: float, fused: bool = False):
    model = make_model()
    # fused=False: each explicit path is checked as itself (fused, the default, is checked below)
    with GNQAuditor(model, lam=lam, path=path, fused=fused) as auditor:
        squared_loss(model, data()).sum().backward()
        return auditor.compute()


def test_setup_is_not_degenerate():
    G = hand_gradients()
    r = G[:, 1]
    assert (r.abs() > 0.1).all()  # every point has a real gradient
    # (W, B) is not a stationary point of the total loss (so not the least-squares fit)
    assert G.sum(0).norm() > 1.0
    # the inliers' gradients span R² (S_{-outlier} is not just λI)
    inliers = torch.cat([G[:OUTLIER], G[OUTLIER + 1:]])
    assert torch.linalg.matrix_rank(inliers) == 2


def test_gradients_by_hand_match_reference():
    ref = exact_gnq(make_model(), squared_loss, data(), lam=1.0)
    G = hand_gradients()
    assert ref.gradients.shape == (7, 2)
    assert rel_err(ref.gradients, G) <= TOL
    assert kernel_err(ref.kernel, G @ G.T) <= TOL


@pytest.mark.parametrize("lam", LAMS)
def test_definitions_agree(lam):
    G = hand_gradients()
    literal = naive_gnq(G, lam)
    assert rel_err(closed_form_gnq(G, lam), literal) <= TOL
    assert rel_err(loo_gnq(G, lam), literal) <= TOL
    ref = exact_gnq(make_model(), squared_loss, data(), lam)
    assert rel_err(ref.gnq, literal) <= TOL


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("lam", LAMS)
def test_auditor_matches_definition(lam, path):
    G = hand_gradients()
    literal = naive_gnq(G, lam)
    res = audit(path, lam)
    assert rel_err(res.gnq, literal) <= TOL
    assert kernel_err(res.kernel, G @ G.T) <= TOL
    used = res.coverage.paths()[""]  # the model is the Linear itself: module name ""
    if path == "auto":
        assert used and used <= {"ghost", "materialize"}
    else:
        assert used == {path}


@pytest.mark.parametrize("lam", LAMS)
def test_outlier_is_most_unique(lam):
    """Point 7 has the highest GNQ, by a clear margin, whatever λ (the geometry, not λ)."""
    gnq = naive_gnq(hand_gradients(), lam)
    order = torch.argsort(gnq, descending=True)
    assert order[0].item() == OUTLIER
    assert gnq[OUTLIER] > 1.5 * gnq[order[1]]
    res = audit("auto", lam)
    assert torch.argmax(res.gnq).item() == OUTLIER


def test_small_lambda_limit():
    """As λ → 0, GNQ_j → g_jᵀ S_{-j}⁻¹ g_j with the unregularised S_{-j} (full rank here)."""
    G = hand_gradients()
    limit = closed_form_gnq(G, 0.0)
    assert rel_err(naive_gnq(G, 1e-9), limit) <= 1e-6  # O(λ) difference, not rounding
    assert rel_err(audit("auto", 1e-3).gnq, limit) > 1e-6  # ...and λ = 1e-3 is visibly different
