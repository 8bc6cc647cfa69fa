"""Reduced-precision paths: bf16 autocast (fp32 accumulation) and TF32 stay within 1e-3 of a
float64 reference; float64 paths are unchanged (tests/engine/test_fused.py, ≤ 1e-9 everywhere)."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import rel_err
from lm_fixtures import lm_batch, tiny_gpt2, tiny_llama

from gnq_core import GNQAuditor, exact_gnq, per_example_lm_loss
from gnq_core.engine import gnq_from_kernel
from gnq_core.engine.math.reference import per_example_gradients

MODELS = {"gpt2": tiny_gpt2, "llama": tiny_llama}
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def lm_losses(model, batch):
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return per_example_lm_loss(out.logits, batch["labels"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_bf16_autocast_gnq_within_1e3_of_the_float64_reference_of_the_same_step(name, fused, device):
    """The reference: each example's gradient of the same autocast forward by its own backward,
    K = G Gᵀ and the solve in float64.  The auditor's kernels accumulate in fp32."""
    torch.manual_seed(41)
    model = MODELS[name]().float().eval().to(device)
    batch = {k: v.to(device) for k, v in lm_batch([12, 9, 12, 6, 10, 12], seed=3).items()}
    reference = copy.deepcopy(model)
    with torch.autocast(device, dtype=torch.bfloat16):
        losses = lm_losses(reference, batch)
    G = per_example_gradients(losses, list(reference.parameters()))
    ref = gnq_from_kernel(G @ G.T, 1e-3).gnq
    with GNQAuditor(model, lam=1e-3, fused=fused, path="materialize" if fused else "auto") as auditor:
        with torch.autocast(device, dtype=torch.bfloat16):
            losses = lm_losses(model, batch)
        losses.sum().backward()
        res = auditor.compute()
    if fused:
        assert "fused" in res.coverage.paths()["lm_head"]
    assert rel_err(res.gnq.cpu(), ref.cpu()) <= 1e-3
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="TF32 exists on CUDA only")
@pytest.mark.parametrize("fused", [False, True])
def test_tf32_gnq_within_1e3_of_the_float64_reference(fused):
    torch.manual_seed(42)
    model = tiny_gpt2().eval()
    batch = lm_batch([12, 9, 12, 6, 10, 12], seed=4)
    ref = exact_gnq(model, lm_losses, batch, 1e-3).gnq
    model = model.float().cuda()
    batch = {k: v.cuda() for k, v in batch.items()}
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        with GNQAuditor(model, lam=1e-3, fused=fused) as auditor:
            lm_losses(model, batch).sum().backward()
            res = auditor.compute()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    assert rel_err(res.gnq.cpu(), ref) <= 1e-3
