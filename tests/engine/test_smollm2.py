"""A real pretrained checkpoint, called the way users call it: SmolLM2-135M (the lead's offline
copy, LlamaForCausalLM with GQA and tied embeddings) in float64, its first 2 of 30 layers
(``num_hidden_layers=2`` at load: the pretrained weights of those layers, embeddings and final
norm), train mode, ``use_cache`` at its default, a right-padded batch of B=3 real texts, T=8
(B equals its 3 key-value heads), on every path against explicit per-example gradients.
Skips when the copy is absent."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import TOL, kernel_err, rel_err

from gnq_core import GNQAuditor
from gnq_core.engine.math.losses import per_example_lm_loss
from gnq_core.engine.math.reference import loo_gnq, per_example_gradients

MODEL = Path("/root/.cache/gnq-audit/models/smollm2-135m-instruct")
TEXTS = ["The capital of France is Paris, a city on the Seine.",
         "Water boils at one hundred degrees.",
         "Gradient uniqueness measures what a model memorised."]

pytestmark = pytest.mark.skipif(not (MODEL / "model.safetensors").exists(), reason=f"{MODEL} is absent")


@pytest.fixture(scope="module")
def smollm2():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(MODEL, num_hidden_layers=2, dtype=torch.float64)
    tok = AutoTokenizer.from_pretrained(MODEL)
    tok.padding_side = "right"
    enc = tok(TEXTS, return_tensors="pt", padding="max_length", truncation=True, max_length=8)
    enc["attention_mask"][1, -2:] = 0  # a shorter text: right padding inside the window
    enc["input_ids"][1, -2:] = tok.pad_token_id
    batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    model.train()
    G = per_example_gradients(_losses(model, batch), [p for p in model.parameters() if p.requires_grad])
    model.zero_grad(set_to_none=True)
    return model, batch, G


def _losses(model, batch):
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    return per_example_lm_loss(model(**batch).logits, labels)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["unfused", "fused", "posthoc"])
def test_smollm2_is_exact_on_a_padded_batch(smollm2, path):
    model, batch, G = smollm2
    assert model.config.use_cache and model.config.tie_word_embeddings and model.training
    with GNQAuditor(model, lam=1e-2, fused=path == "fused") as auditor:
        objective = _losses(model, batch).sum()
        auditor.backward(objective) if path == "posthoc" else objective.backward()
        res = auditor.compute()
    model.zero_grad(set_to_none=True)
    K = G @ G.T
    assert kernel_err(res.kernel, K) <= TOL
    assert rel_err(res.gnq, loo_gnq(G, 1e-2)) <= TOL
