"""Auditor behaviour: clear errors, edge cases, reuse and sharing, caches, the MLP of Table 2."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import PATHS, TOL, kernel_err, rel_err
from torch import nn

from gnq_core import GNQAuditor, UnsupportedModuleError, exact_gnq
from gnq_core.engine import BatchDimensionError, UncoveredParametersError


def ce_losses(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="none")


def mlp():
    return nn.Sequential(nn.Linear(100, 40), nn.ReLU(), nn.Linear(40, 10))


def mlp_batch(B, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, 100, generator=g), torch.randint(0, 10, (B,), generator=g)


def audit(model, batch, lam, loss_fn=ce_losses, path="auto", weights=None):
    with GNQAuditor(model, lam=lam, path=path) as auditor:
        losses = loss_fn(model, batch)
        (losses.sum() if weights is None else (weights * losses).sum()).backward()
        return auditor.compute(weights=weights)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("lam", [1e-6, 1e-3, 1e-1, 1.0, 1e2])
def test_paper_mlp_100_40_10_over_lambda(path, lam):
    torch.manual_seed(1)
    model, batch = mlp(), mlp_batch(32, seed=int(lam * 1e6) % 1000)
    res = audit(model, batch, lam, path=path)
    ref = exact_gnq(model, ce_losses, batch, lam)
    assert rel_err(res.gnq, ref.gnq) <= TOL
    assert kernel_err(res.kernel, ref.kernel) <= TOL


def test_mean_objective_weights():
    torch.manual_seed(2)
    model, batch = mlp(), mlp_batch(16, seed=2)
    w = torch.full((16,), 1 / 16)
    res = audit(model, batch, 1e-2, weights=w)
    ref = exact_gnq(model, ce_losses, batch, 1e-2)
    assert rel_err(res.gnq, ref.gnq) <= TOL
    # forgetting the weights changes the scale of g relative to λ, hence GNQ
    assert rel_err(audit(model, batch, 1e-2, loss_fn=lambda m, b: ce_losses(m, b) / 16).gnq,
                   ref.gnq) > 1e-3


def test_batch_of_one_is_squared_norm_over_lambda():
    torch.manual_seed(3)
    model, batch = mlp(), mlp_batch(1, seed=3)
    res = audit(model, batch, 0.5)
    g = exact_gnq(model, ce_losses, batch, 0.5).gradients[0]
    assert rel_err(res.gnq, (g @ g / 0.5).reshape(1)) <= TOL


class Reused(nn.Module):
    """One Linear applied twice, plus a frozen bias elsewhere: sharing by module reuse."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.shared = nn.Linear(8, 8)
        self.out = nn.Linear(8, 3)
        self.out.bias.requires_grad_(False)

    def forward(self, x):
        h = torch.tanh(self.shared(torch.tanh(self.inp(x))))
        return self.out(torch.tanh(self.shared(h)))


@pytest.mark.parametrize("path", PATHS)
def test_module_called_twice_gets_exact_cross_terms(path):
    torch.manual_seed(4)
    model = Reused()
    batch = (torch.randn(7, 6), torch.randint(0, 3, (7,)))
    res = audit(model, batch, 1e-3, path=path)
    ref = exact_gnq(model, ce_losses, batch, 1e-3)
    assert rel_err(res.gnq, ref.gnq) <= TOL
    assert "tied" in res.coverage.paths()["shared"]
    assert res.coverage.trainable_numel == sum(p.numel() for p in model.parameters()) - 3


class Sequence3D(nn.Module):
    """Linear layers over [B, T, d] with a position-wise mixing that couples positions."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(5, 7)
        self.b = nn.Linear(7, 4, bias=False)
        self.pos = nn.Embedding(9, 5)
        self.tok = nn.Embedding(11, 5, padding_idx=0)

    def forward(self, tokens):
        T = tokens.shape[1]
        h = self.tok(tokens) + self.pos(torch.arange(T).unsqueeze(0))  # [1, T] broadcast
        h = torch.tanh(self.a(h)).cumsum(dim=1)  # positions interact
        return self.b(h).sum(dim=(1, 2))


@pytest.mark.parametrize("path", PATHS)
def test_sequences_all_position_pairs_padding_idx_and_broadcast_positions(path):
    torch.manual_seed(5)
    model = Sequence3D()
    tokens = torch.randint(0, 11, (6, 9))
    tokens[:, -3:] = 0  # padding rows get no gradient
    fn = lambda m, t: m(t) ** 2  # noqa: E731
    res = audit(model, tokens, 1e-2, loss_fn=fn, path=path)
    ref = exact_gnq(model, fn, tokens, 1e-2)
    assert rel_err(res.gnq, ref.gnq) <= TOL
    assert kernel_err(res.kernel, ref.kernel) <= TOL


def test_flattened_same_position_shortcut_is_not_what_we_compute():
    """Guard against the flattened-sequence approximation: it would differ from the truth."""
    torch.manual_seed(6)
    lin = nn.Linear(4, 3)
    x = torch.randn(5, 6, 4)
    fn = lambda m, x: m(x).sin().sum(dim=(1, 2))  # noqa: E731
    res = audit(lin, x, 1e-2, loss_fn=fn)
    with torch.no_grad():
        y = lin(x)
    delta = y.cos()  # ∂ℓ_j/∂y
    X1 = torch.cat([x, torch.ones(5, 6, 1)], -1)
    shortcut = (X1.reshape(5, -1) @ X1.reshape(5, -1).T) * (delta.reshape(5, -1) @ delta.reshape(5, -1).T)
    exact = exact_gnq(lin, fn, x, 1e-2).kernel
    assert kernel_err(res.kernel, exact) <= TOL
    assert kernel_err(shortcut, exact) > 1e-2


def test_multihead_attention_is_covered():
    torch.manual_seed(7)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(4, 5, 8)
    fn = lambda m, x: m(x, x, x, need_weights=False)[0].pow(2).sum(dim=(1, 2))  # noqa: E731
    res = audit(mha, x, 1e-2, loss_fn=fn)
    assert rel_err(res.gnq, exact_gnq(mha, fn, x, 1e-2).gnq) <= TOL


def test_output_not_reaching_the_loss_contributes_zero():
    torch.manual_seed(8)

    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.used, self.unused = nn.Linear(5, 6), nn.Linear(6, 2), nn.Linear(6, 2)

        def forward(self, x):
            h = self.body(x).tanh()
            self.unused(h)  # computed, never used by the loss
            return self.used(h)

    model = TwoHeads()
    batch = (torch.randn(5, 5), torch.randint(0, 2, (5,)))
    res = audit(model, batch, 1e-2)
    assert rel_err(res.gnq, exact_gnq(model, ce_losses, batch, 1e-2).gnq) <= TOL


def test_caches_are_freed_during_backward():
    torch.manual_seed(9)
    model, batch = mlp(), mlp_batch(8, seed=9)
    with GNQAuditor(model, lam=1e-2) as auditor:
        ce_losses(model, batch).sum().backward()
        calls = auditor._pass.calls
        assert calls and all(c.done and c.saved is None and c.grads is None for c in calls)
        assert not auditor._pass.pending
        auditor.compute()


def test_batchnorm_train_mode_is_refused_eval_mode_is_exact():
    torch.manual_seed(10)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 2))
    batch = (torch.randn(5, 4), torch.randint(0, 2, (5,)))
    with GNQAuditor(model, lam=1e-2), pytest.raises(UnsupportedModuleError, match="BatchNorm1d"):
        ce_losses(model, batch)
    model.eval()
    res = audit(model, batch, 1e-2)
    assert rel_err(res.gnq, exact_gnq(model, ce_losses, batch, 1e-2).gnq) <= TOL


class Sneaky(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        h = F.linear(x, self.enc.weight)  # enc.weight used in Sneaky.forward, not enc's
        return self.head(h)


def test_parameter_used_by_its_parent_is_covered_on_the_parent():
    """The generic kernel on the enclosing module (here the root) covers a child's weight
    that the parent uses directly: exact, not refused."""
    torch.manual_seed(3)
    model = Sneaky()
    batch = (torch.randn(5, 4), torch.randint(0, 2, (5,)))
    res = audit(model, batch, 1e-2)
    assert rel_err(res.gnq, exact_gnq(model, ce_losses, batch, 1e-2).gnq) <= TOL
    assert [e.kernel for e in res.coverage.entries] == ["enclosing-vjp"]


def test_parameter_used_by_a_module_outside_its_owner_is_covered_on_both():
    """A module that uses a sibling's weight: the generic kernel on the module enclosing both
    (here the root) covers it exactly."""
    class UsesSibling(nn.Module):
        def __init__(self, sibling: nn.Linear):
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self._sibling = [sibling]  # not a submodule: its weight is used from outside

        def forward(self, x):
            return self.proj(x) @ self._sibling[0].weight.T

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Linear(4, 4)
            self.user = UsesSibling(self.enc)
            self.head = nn.Linear(4, 2)

        def forward(self, x):
            return self.head(self.user(self.enc(x)))

    torch.manual_seed(4)
    model = Model()
    batch = (torch.randn(5, 4), torch.randint(0, 2, (5,)))
    res = audit(model, batch, 1e-2)
    assert rel_err(res.gnq, exact_gnq(model, ce_losses, batch, 1e-2).gnq) <= TOL
    assert [e.kernel for e in res.coverage.entries] == ["enclosing-vjp"]


def test_parameter_used_where_nothing_encloses_it_is_named():
    """The root returns a scalar (no batch dimension): nothing can enclose the direct use."""
    class ScalarOut(Sneaky):
        def forward(self, x):
            return super().forward(x).sum()

    model = ScalarOut()
    with GNQAuditor(model, lam=1e-2), pytest.raises(UncoveredParametersError, match="enc.weight"):
        model(torch.randn(3, 4))


def test_compute_before_backward_and_twice_are_errors():
    model, batch = mlp(), mlp_batch(4, seed=11)
    with GNQAuditor(model, lam=1e-2) as auditor:
        with pytest.raises(RuntimeError, match="before a backward"):
            auditor.compute()
        losses = ce_losses(model, batch)
        with pytest.raises(RuntimeError, match="before a backward"):
            auditor.compute()
        losses.sum().backward()
        auditor.compute()
        with pytest.raises(RuntimeError, match="already called"):
            auditor.compute()
        ce_losses(model, batch).sum().backward()  # next step works again
        assert auditor.compute().gnq.shape == (4,)


def test_no_grad_forwards_are_ignored_and_close_removes_hooks():
    model, batch = mlp(), mlp_batch(4, seed=12)
    auditor = GNQAuditor(model, lam=1e-2)
    with torch.no_grad():
        model(batch[0][:2])  # e.g. evaluation between steps
    ce_losses(model, batch).sum().backward()
    assert auditor.compute().gnq.shape == (4,)
    auditor.close()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_flattened_batch_is_a_clear_error():
    class Flattening(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.head = nn.Linear(3, 4), nn.Linear(4, 2)

        def forward(self, x):  # [B, T, 3] -> head sees [B·T, 4]: examples are mixed up
            return self.head(self.body(x).reshape(-1, 4))

    model = Flattening()
    with GNQAuditor(model, lam=1e-2), pytest.raises(BatchDimensionError, match="'head'"):
        model(torch.randn(4, 5, 3))


def test_invalid_arguments():
    with pytest.raises(ValueError, match="lam"):
        GNQAuditor(mlp(), lam=0)
    with pytest.raises(ValueError, match="path"):
        GNQAuditor(mlp(), path="fast")
    frozen = mlp().requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable"):
        GNQAuditor(frozen)
    model, batch = mlp(), mlp_batch(3, seed=13)
    with GNQAuditor(model) as auditor:
        ce_losses(model, batch).sum().backward()
        with pytest.raises(ValueError, match="non-zero"):
            auditor.compute(weights=torch.tensor([1.0, 0.0, 1.0]))


@pytest.mark.parametrize("frozen_bias", [False, True])
def test_layernorm_closed_form_over_several_normalised_dims(frozen_bias):
    torch.manual_seed(24)
    norm = nn.LayerNorm((4, 5))
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    norm.bias.requires_grad_(not frozen_bias)
    model = nn.Sequential(nn.Linear(5, 5), norm, nn.Tanh())
    x = torch.randn(6, 3, 4, 5)
    fn = lambda m, x: m(x).pow(3).sum(dim=(1, 2, 3))  # noqa: E731
    res = audit(model, x, 1e-2, loss_fn=fn)
    assert res.coverage.entries[1].kernel == "layernorm"
    assert rel_err(res.gnq, exact_gnq(model, fn, x, 1e-2).gnq) <= TOL
