"""Conv1d / Conv2d (unfold kernel) and GroupNorm (generic vjp) against explicit gradients.

Every conv option the unfold kernel has to reproduce is exercised: groups > 1 (including
depthwise), stride, zero / asymmetric / 'same' padding (with an even kernel, where 'same'
pads unevenly), non-zero padding modes (reflect, circular, replicate), dilation, and layers
with and without bias.  For each path the auditor's GNQ and kernel must match the
torch.func reference ``exact_gnq`` to float64 rounding.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import PATHS, TOL, kernel_err, rel_err
from torch import nn

from gnq_core import GNQAuditor, exact_gnq

# torch warns that even-kernel padding='same' makes a padded copy of the input; that is the case
# under test, not a problem
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")

LAM = 1e-2
CONV_PATHS = {"ghost", "materialize"}


class Net2d(nn.Module):
    """[B, 2, 9, 9] -> 3 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 4, 3, padding=1)  # bias, zero padding
        self.c2 = nn.Conv2d(4, 6, 3, stride=2, groups=2, bias=False)  # groups, stride, no bias
        self.gn = nn.GroupNorm(3, 6)  # generic per-example vjp
        self.c3 = nn.Conv2d(6, 4, (2, 3), stride=(1, 2), dilation=(2, 1), padding=(1, 2),
                            padding_mode="reflect")  # asymmetric everything, reflect padding
        self.c4 = nn.Conv2d(4, 4, 2, padding="same", padding_mode="circular", groups=4,
                            bias=False)  # depthwise, even kernel 'same' (uneven padding)
        self.head = nn.Linear(4 * 4 * 3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.c1(x))
        h = torch.tanh(self.gn(self.c2(h)))
        h = torch.tanh(self.c3(h))
        h = torch.tanh(self.c4(h))
        return self.head(h.flatten(1))


class Net1d(nn.Module):
    """[B, 3, 11] -> 2 outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(3, 4, 4, padding="same", padding_mode="reflect")  # even kernel 'same'
        self.c2 = nn.Conv1d(4, 4, 3, padding="same", padding_mode="circular", dilation=2,
                            groups=4)  # depthwise, dilated, circular
        self.c3 = nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2, bias=False)
        self.c4 = nn.Conv1d(6, 3, 2, padding="same")  # 'same' with zero padding
        self.c5 = nn.Conv1d(3, 3, 3, padding=2, padding_mode="replicate", dilation=2)
        self.gn = nn.GroupNorm(1, 3)
        self.head = nn.Linear(3 * 6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.c1(x))
        h = torch.tanh(self.c2(h))
        h = torch.tanh(self.c3(h))
        h = torch.tanh(self.c4(h))
        h = torch.tanh(self.gn(self.c5(h)))
        return self.head(h.flatten(1))


class SharedConv(nn.Module):
    """One grouped conv applied twice: its weight's per-example gradient is a sum of two uses."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 4, 3, padding=1, groups=2)
        self.head = nn.Linear(4 * 7, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.conv(x))
        h = torch.tanh(self.conv(h))
        return self.head(h.flatten(1))


def ce_loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="none")


def sq_loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return 0.5 * (model(x) - y).pow(2).sum(-1)


def audit(model, loss_fn, batch, path, lam=LAM, weights=None):
    """The default auditor (check_uses=True): conv and GroupNorm nets must pass the use check."""
    model.zero_grad(set_to_none=True)
    with GNQAuditor(model, lam=lam, path=path) as auditor:
        losses = loss_fn(model, batch)
        (losses if weights is None else losses * weights).sum().backward()
        return auditor.compute(weights=weights)


def check_against_reference(res, ref) -> None:
    assert torch.isfinite(res.gnq).all()
    assert (ref.gnq > 0).all()
    # the comparison is not vacuous: examples differ, and K has real off-diagonal structure
    assert ref.gnq.max() > 1.5 * ref.gnq.min()
    assert rel_err(res.gnq, ref.gnq) <= TOL
    assert kernel_err(res.kernel, ref.kernel) <= TOL


def conv_names(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, nn.Conv1d | nn.Conv2d)]


def check_paths(res, model: nn.Module, path: str) -> None:
    paths = res.coverage.paths()
    convs = conv_names(model)
    assert convs
    for name in convs:
        used = paths[name]
        assert used, f"{name} reported no path"
        if path == "auto":
            assert used <= CONV_PATHS
        else:
            assert used == {path}
    for name, m in model.named_modules():
        if isinstance(m, nn.GroupNorm):
            assert paths[name] == {"per-example"}
    entries = {e.module: e for e in res.coverage.entries}
    assert all(entries[n].kernel == "conv-unfold" for n in convs)
    assert res.coverage.covered_numel == res.coverage.trainable_numel


def batch2d(seed: int, B: int = 6):
    torch.manual_seed(seed)
    model = Net2d()
    x = torch.randn(B, 2, 9, 9)
    y = torch.randint(0, 3, (B,))
    return model, (x, y)


def batch1d(seed: int, B: int = 6):
    torch.manual_seed(seed)
    model = Net1d()
    x = torch.randn(B, 3, 11)
    y = torch.randn(B, 2)
    return model, (x, y)


def test_net_shapes():
    model, (x, _) = batch2d(0, B=2)
    assert model.c4(torch.tanh(model.c3(model.gn(model.c2(model.c1(x)))))).shape == (2, 4, 4, 3)
    model, (x, _) = batch1d(0, B=2)
    h = model.c4(model.c3(model.c2(model.c1(x))))
    assert h.shape == (2, 3, 6)
    assert model.c5(h).shape == (2, 3, 6)


@pytest.mark.parametrize("path", PATHS)
def test_conv2d_groupnorm(path):
    model, batch = batch2d(seed=11)
    ref = exact_gnq(model, ce_loss, batch, LAM)
    res = audit(model, ce_loss, batch, path)
    check_against_reference(res, ref)
    check_paths(res, model, path)


@pytest.mark.parametrize("path", PATHS)
def test_conv1d_padding_modes_and_groups(path):
    model, batch = batch1d(seed=23)
    ref = exact_gnq(model, sq_loss, batch, LAM)
    res = audit(model, sq_loss, batch, path)
    check_against_reference(res, ref)
    check_paths(res, model, path)


@pytest.mark.parametrize("path", PATHS)
def test_conv2d_mean_loss_weights(path):
    """A batch-mean objective: every Δ carries 1/B, and compute(weights) undoes it."""
    model, batch = batch2d(seed=37, B=5)
    B = batch[0].shape[0]
    ref = exact_gnq(model, ce_loss, batch, LAM)
    w = torch.full((B,), 1.0 / B)
    res = audit(model, ce_loss, batch, path, weights=w)
    check_against_reference(res, ref)


@pytest.mark.parametrize("path", PATHS)
def test_conv1d_nonuniform_weights(path):
    """Per-example weights that differ (like HF's token-mean loss)."""
    model, batch = batch1d(seed=41, B=5)
    ref = exact_gnq(model, sq_loss, batch, LAM)
    w = torch.tensor([0.1, 0.5, 2.0, 0.25, 1.5])
    res = audit(model, sq_loss, batch, path, weights=w)
    check_against_reference(res, ref)


@pytest.mark.parametrize("path", PATHS)
def test_shared_grouped_conv(path):
    """A grouped conv used twice in one forward: the per-example gradient sums both uses."""
    torch.manual_seed(53)
    model = SharedConv()
    batch = (torch.randn(5, 4, 7), torch.randn(5, 2))
    ref = exact_gnq(model, sq_loss, batch, LAM)
    res = audit(model, sq_loss, batch, path)
    check_against_reference(res, ref)
    assert res.coverage.paths()["conv"]
    assert {e.module: e for e in res.coverage.entries}["conv"].calls == 2


@pytest.mark.parametrize("path", PATHS)
def test_conv_gradients_do_not_change(path):
    """The hooks never modify gradients: param.grad equals the unaudited backward's."""
    model, batch = batch1d(seed=61, B=4)
    model.zero_grad(set_to_none=True)
    sq_loss(model, batch).sum().backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    audit(model, sq_loss, batch, path)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[n], rtol=1e-12, atol=1e-14)

