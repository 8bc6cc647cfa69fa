"""Fused path: exact GNQ, and param.grad equal to the unfused path up to float rounding."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import TOL, rel_err
from lm_fixtures import lm_batch, tiny_gpt2, tiny_llama
from test_auditor_behaviour import Reused
from torch import nn

from gnq_core import GNQAuditor, exact_gnq, per_example_lm_loss


def lm_losses(model, batch):
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return per_example_lm_loss(out.logits, batch["labels"])


def ce_losses(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1], reduction="none")


def run(model, loss_fn, batch, fused, path="auto", budget=None, dtype_mean=True):
    model = copy.deepcopy(model)
    kwargs = {"memory_budget": budget} if budget else {}
    with GNQAuditor(model, lam=1e-3, fused=fused, path=path, **kwargs) as auditor:
        losses = loss_fn(model, batch)
        B = losses.shape[0]
        losses.mean().backward()
        res = auditor.compute(weights=torch.full((B,), 1 / B))
    grads = {n: p.grad for n, p in model.named_parameters()}
    return res, grads


CASES = {
    "mlp": (lambda: nn.Sequential(nn.Linear(20, 12), nn.Tanh(), nn.Linear(12, 5)), ce_losses,
            lambda: (torch.randn(9, 20), torch.randint(0, 5, (9,)))),
    "reused": (Reused, ce_losses, lambda: (torch.randn(7, 6), torch.randint(0, 3, (7,)))),
    "gpt2": (tiny_gpt2, lm_losses, lambda: lm_batch([12, 7, 12, 4, 9], seed=7)),
    "llama": (tiny_llama, lm_losses, lambda: lm_batch([10, 6, 10, 3], seed=8)),
}


@pytest.fixture(params=[1, 3], ids=["1-thread", "3-threads"])
def threads(request):
    """One thread: the CPU Gram kernel (engine/math/cpu_gram.py); three: MKL's products."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("path", ["auto", "materialize"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_is_exact_and_keeps_gradients(case, path, threads):
    torch.manual_seed(21)
    make, loss_fn, make_batch = CASES[case]
    model, batch = make().eval(), make_batch()
    res, grads = run(model, loss_fn, batch, fused=True, path=path)
    _, plain = run(model, loss_fn, batch, fused=False)
    assert rel_err(res.gnq, exact_gnq(model, loss_fn, batch, 1e-3).gnq) <= TOL
    for name, g in plain.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-12, atol=1e-15, msg=name)
    paths = res.coverage.paths()
    if path == "materialize":
        assert any("fused" in p for p in paths.values())
    norms = [n for n, m in model.named_modules() if isinstance(m, nn.LayerNorm)]
    assert all(paths[n] == {"fused"} for n in norms), {n: paths[n] for n in norms}


def test_fused_row_chunks_within_a_tiny_memory_budget(threads):
    torch.manual_seed(22)
    make, loss_fn, make_batch = CASES["gpt2"]
    model, batch = make().eval(), make_batch()
    res, grads = run(model, loss_fn, batch, fused=True, path="materialize", budget=4096)
    _, plain = run(model, loss_fn, batch, fused=False)
    assert rel_err(res.gnq, exact_gnq(model, loss_fn, batch, 1e-3).gnq) <= TOL
    for name, g in plain.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-12, atol=1e-15, msg=name)


def test_fused_float32_gradients_match_to_rounding_and_close_restores_forward():
    torch.set_default_dtype(torch.float32)
    torch.manual_seed(23)
    model = tiny_gpt2(dropout=0.1).train()
    batch = lm_batch([12, 9, 12, 5], seed=9)

    def grads(fused):
        m = copy.deepcopy(model)
        auditor = GNQAuditor(m, lam=1e-2, fused=fused, path="materialize")
        torch.manual_seed(0)
        lm_losses(m, batch).sum().backward()
        auditor.compute()
        auditor.close()
        assert all("forward" not in vars(mod) for mod in m.modules())
        return [p.grad for p in m.parameters()]

    for a, b in zip(grads(True), grads(False), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("budget", [None, 4096])
def test_a_backward_while_paused_leaves_the_next_gram_alone(budget):
    """Gradients taken with the auditor paused run the fused layers' backward too; their Grams
    must not reach the pass (they did: the pass's accumulator counted those layers twice)."""
    torch.manual_seed(25)
    make, loss_fn, make_batch = CASES["gpt2"]
    model, batch = make().eval(), make_batch()
    kwargs = {"memory_budget": budget} if budget else {}
    with GNQAuditor(model, lam=1e-3, path="materialize", **kwargs) as auditor:
        losses = loss_fn(model, batch)
        with auditor.paused():
            first = torch.autograd.grad(losses.sum(), list(model.parameters()), retain_graph=True)
        losses.sum().backward()
        res = auditor.compute()
    assert any("fused" in p for p in res.coverage.paths().values())
    assert rel_err(res.gnq, exact_gnq(model, loss_fn, batch, 1e-3).gnq) <= TOL
    for g, p in zip(first, model.parameters(), strict=True):  # the paused backward's gradients
        torch.testing.assert_close(g, p.grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("case", sorted(CASES))
def test_audit_backward_skips_parameter_gradients_and_keeps_gnq_exact(case):
    """auditor.backward differentiates only w.r.t. input-end outputs: same K, no param.grad."""
    torch.manual_seed(24)
    make, loss_fn, make_batch = CASES[case]
    model, batch = make().eval(), make_batch()
    with GNQAuditor(model, lam=1e-3) as auditor:
        auditor.backward(loss_fn(model, batch).sum())
        res = auditor.compute()
    assert all(p.grad is None for p in model.parameters())
    exact = exact_gnq(model, loss_fn, batch, 1e-3)
    assert rel_err(res.gnq, exact.gnq) <= TOL
    assert rel_err(res.kernel, exact.kernel) <= TOL


class _Scaled(nn.Linear):
    """A Linear subclass with its own forward: the registry gives it no kernel by inheritance."""

    def forward(self, x):
        return 2 * super().forward(x)


def test_fusing_is_a_capability_the_registered_kernel_declares():
    from gnq_core.engine.kernels import can_fuse, register
    from gnq_core.engine.kernels.linear import LinearKernel, linear_contributions
    from gnq_core.engine.kernels.registry import _KERNELS

    class ScaledKernel(LinearKernel):  # y = 2(x Wᵀ + b): the same layer with Δ doubled
        name = "scaled-linear"

        def contributions(self, module, saved, grads, params, split):
            return linear_contributions(saved, 2 * grads[0], params, split, False)

        def fused_forward(self, module, args, kwargs, request):
            out = super().fused_forward(module, args, kwargs, request)
            return out if out is NotImplemented else 2 * out

    from gnq_core.engine.kernels import Kernel

    declared = {type(k) for k in _KERNELS.values() if k.fusable}
    assert {"LinearKernel", "Conv1DKernel", "LayerNormKernel"} <= {k.__name__ for k in declared}
    assert all(k.fused_forward is not Kernel.fused_forward for k in declared)
    torch.manual_seed(25)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), _Scaled(5, 3))
    batch = (torch.randn(8, 6), torch.randint(0, 3, (8,)))
    assert not can_fuse(model[2])  # the generic kernel has no fused path
    register(_Scaled)(ScaledKernel)
    try:
        assert can_fuse(model[2]) and can_fuse(model[0]) and not can_fuse(model[1])
        res, _ = run(model, ce_losses, batch, fused=True, path="materialize")
        assert res.coverage.paths()["2"] == {"fused"}
        assert rel_err(res.gnq, exact_gnq(model, ce_losses, batch, 1e-3).gnq) <= TOL
        ScaledKernel.fusable = False  # declared off: the same kernel runs through its hooks
        res, _ = run(model, ce_losses, batch, fused=True, path="materialize")
        assert res.coverage.paths()["2"] == {"materialize"}
        assert rel_err(res.gnq, exact_gnq(model, ce_losses, batch, 1e-3).gnq) <= TOL
    finally:
        _KERNELS.pop(_Scaled, None)


@pytest.mark.parametrize("texts", [8, 16, 11])
@pytest.mark.parametrize("budget", [None, 4096], ids=["one-chunk", "chunks"])
def test_fused_weight_gradient_from_the_gram_pass(texts, budget):
    """One thread: the CPU kernel forms each chunk's Gram and Σ_j G_j (the weight gradient) in one
    pass; full 8-row blocks (8, 16 texts) and a short last block (11): GNQ exact against the
    float64 reference, param.grad equal to the unfused path's."""
    torch.manual_seed(24)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        lengths = [int(n) for n in torch.randint(3, 12, (texts,))]
        model, batch = tiny_gpt2().eval(), lm_batch(lengths, seed=int(torch.randint(0, 99, ())))
        res, grads = run(model, lm_losses, batch, fused=True, path="materialize", budget=budget)
        _, plain = run(model, lm_losses, batch, fused=False)
    finally:
        torch.set_num_threads(before)
    assert rel_err(res.gnq, exact_gnq(model, lm_losses, batch, 1e-3).gnq) <= TOL
    assert any("fused" in p for p in res.coverage.paths().values())
    for name, g in plain.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-12, atol=1e-15, msg=name)
