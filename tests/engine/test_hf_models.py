"""Hugging Face causal LMs: exact GNQ against explicit per-example gradients (float64)."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import PATHS, TOL, kernel_err, rel_err
from lm_fixtures import lm_batch, tiny_gpt2, tiny_llama

from gnq_core import GNQAuditor, exact_gnq, lm_token_mean_weights, per_example_lm_loss
from gnq_core.engine.math.reference import loo_gnq, per_example_gradients


def lm_losses(model, batch):
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return per_example_lm_loss(out.logits, batch["labels"])


def audited(model, batch, lam, path="auto", weights=None):
    with GNQAuditor(model, lam=lam, path=path) as auditor:
        losses = lm_losses(model, batch)
        objective = losses.sum() if weights is None else (weights * losses).sum()
        objective.backward()
        return auditor.compute(weights=weights)


@pytest.mark.parametrize("path", PATHS)
def test_gpt2_tied_embeddings_right_padded(path):
    torch.manual_seed(11)
    model = tiny_gpt2().eval()
    batch = lm_batch([14, 9, 5, 12, 3, 14], seed=1)
    res = audited(model, batch, lam=1e-3, path=path)
    ref = exact_gnq(model, lm_losses, batch, 1e-3)
    assert rel_err(res.gnq, ref.gnq) <= TOL
    assert kernel_err(res.kernel, ref.kernel) <= TOL
    paths = res.coverage.paths()
    assert "tied" in paths["transformer.wte"]  # the wte/lm_head cross terms were added
    assert paths["transformer.h.0.ln_1"] == {"fused"}  # LayerNorm: the default fused path
    assert res.coverage.covered_numel == res.coverage.trainable_numel


@pytest.mark.parametrize("path", PATHS)
def test_llama_untied_rmsnorm_no_bias(path):
    torch.manual_seed(12)
    model = tiny_llama().eval()
    batch = lm_batch([10, 4, 10, 7], seed=2)
    res = audited(model, batch, lam=1e-2, path=path)
    ref = exact_gnq(model, lm_losses, batch, 1e-2)
    assert rel_err(res.gnq, ref.gnq) <= TOL
    assert kernel_err(res.kernel, ref.kernel) <= TOL
    assert res.coverage.paths()["model.norm"] == {"per-example"}
    assert {e.kernel for e in res.coverage.entries if e.module_type == "LlamaRMSNorm"} == {"rmsnorm"}
    assert "tied" not in set().union(*res.coverage.paths().values())


def test_token_mean_objective_with_weights():
    """A token-mean objective is Σ_j (n_j/N) ℓ_j: compute(weights=...) recovers GNQ of ℓ_j."""
    torch.manual_seed(13)
    model = tiny_gpt2().eval()
    batch = lm_batch([12, 6, 9, 4], seed=3)
    weights = lm_token_mean_weights(batch["labels"])
    res = audited(model, batch, lam=1e-3, weights=weights)
    ref = exact_gnq(model, lm_losses, batch, 1e-3)
    assert rel_err(res.gnq, ref.gnq) <= TOL


def test_hf_own_loss_with_token_mean_weights():
    """model(**batch).loss is HF's token mean; its loss code casts logits to float32, so the
    match is to float32 precision even for a float64 model."""
    torch.manual_seed(13)
    model = tiny_gpt2().eval()
    batch = lm_batch([12, 6, 9, 4], seed=3)
    with GNQAuditor(model, lam=1e-3) as auditor:
        model(**batch).loss.backward()
        res = auditor.compute(weights=lm_token_mean_weights(batch["labels"]))
    ref = exact_gnq(model, lm_losses, batch, 1e-3)
    assert rel_err(res.gnq, ref.gnq) <= 1e-5
    unweighted = audited(model, batch, lam=1e-3)  # without weights the scale is wrong
    assert rel_err(unweighted.gnq, ref.gnq) <= TOL


def test_gpt2_dropout_in_train_mode_sees_the_masks_used():
    """With dropout, the reference must use the same forward (same masks) as the batch."""
    torch.manual_seed(14)
    model = tiny_gpt2(dropout=0.2).train()
    batch = lm_batch([11, 7, 11, 5], seed=4)
    with GNQAuditor(model, lam=1e-3) as auditor:
        losses = lm_losses(model, batch)
        with auditor.paused():
            G = per_example_gradients(losses, list(model.parameters()))
        losses.sum().backward()
        res = auditor.compute()
    assert rel_err(res.gnq, loo_gnq(G, 1e-3)) <= TOL
    assert kernel_err(res.kernel, G @ G.T) <= TOL


def test_bf16_autocast_runs_with_fp32_gram_and_float64_kernel():
    torch.manual_seed(15)
    model = tiny_gpt2().float().eval()
    batch = lm_batch([10, 10, 6, 8], seed=5)
    with GNQAuditor(model, lam=1e-2) as auditor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            losses = lm_losses(model, batch)
        losses.sum().backward()
        res = auditor.compute()
    assert res.gnq.dtype == torch.float64 and res.kernel.dtype == torch.float64
    ref = exact_gnq(model.double(), lm_losses, batch, 1e-2)
    # bf16 has ~3 significant digits: agreement to a few percent, not 1e-9
    assert rel_err(res.kernel.diagonal(), ref.kernel.diagonal()) < 0.1
    assert torch.isfinite(res.gnq).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_auditor_does_not_change_param_grad_bitwise(dtype):
    torch.manual_seed(16)
    base = tiny_gpt2(dropout=0.1).to(dtype).train()
    batch = lm_batch([12, 8, 12, 3, 9], seed=6)

    def grads(with_auditor):
        model = copy.deepcopy(base)
        auditor = GNQAuditor(model, lam=1e-2, fused=False) if with_auditor else None  # hooks only
        torch.manual_seed(0)  # same dropout masks in both runs
        lm_losses(model, batch).mean().backward()
        if auditor:
            auditor.compute(weights=torch.full((5,), 1 / 5))
            auditor.close()
        return [p.grad for p in model.parameters()]

    for a, b in zip(grads(False), grads(True), strict=True):
        assert torch.equal(a, b)
