"""Activation (gradient) checkpointing is exact.  torch.utils.checkpoint recomputes a
region's forward inside the backward; the auditor recognises the recomputation (engine/passes/recompute.py)
and uses each call's capture once: GNQ equals explicit per-example gradients (float64) for both
reentrant settings, fused or not, and the weight gradients equal those of the same model without
checkpointing.  Trainer(activation_checkpointing=True), once gradient_checkpointing, gives the GNQ
of the run without it."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
import torch
from conftest import TOL, rel_err
from lm_fixtures import PAD_ID, lm_batch, texts, tiny_gpt2, tiny_llama, tokenizer
from transformers import TrainingArguments

from gnq_core import GNQAuditor, exact_gnq, per_example_lm_loss
from gnq_core.integrations.hf import GNQConfig, GNQTrainer, lm_collator

MODELS = {"gpt2": tiny_gpt2, "llama": tiny_llama}


def lm_losses(model, batch):
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return per_example_lm_loss(out.logits, batch["labels"])


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("reentrant", [True, False])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_checkpointed_model_gnq_and_gradients_are_exact(name, reentrant, fused):
    torch.manual_seed(11 + reentrant + 2 * fused)
    model = MODELS[name]()
    plain = copy.deepcopy(model).train()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
    model.train()
    with GNQAuditor(model, lam=1e-2, fused=fused) as auditor:
        for step in range(2):  # the second pass: the counts of the first are not carried over
            batch = lm_batch([9, 12, 7, 12, 5][: 4 + step], seed=20 + step)
            ref = exact_gnq(plain, lm_losses, batch, 1e-2).gnq
            model.zero_grad(set_to_none=True)
            lm_losses(model, batch).sum().backward()
            res = auditor.compute()
            assert rel_err(res.gnq, ref) <= TOL, step
    plain.zero_grad(set_to_none=True)
    lm_losses(plain, batch).sum().backward()
    grads = dict(plain.named_parameters())
    for n, p in model.named_parameters():
        expected = grads[n].grad
        assert (p.grad - expected).abs().max() <= 1e-9 * expected.abs().max().clamp_min(1e-300), n


def rows() -> list[dict]:
    tok = tokenizer()
    pool = texts()
    return [{"input_ids": tok.encode(pool[i]).ids[: 4 + (3 * i) % 11], "example_id": i} for i in range(12)]


def trainer_gnq(tmp_path, lora: bool = False, **kw) -> pd.DataFrame:
    torch.manual_seed(0)
    model = tiny_llama()
    if lora:  # the usual large-model recipe: a LoRA adapter trained with checkpointing
        peft = pytest.importorskip("peft")
        model = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"],
                                                           init_lora_weights=False))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=3,
                             gradient_accumulation_steps=2, num_train_epochs=1, learning_rate=1e-2,
                             optim="sgd", report_to=[], save_strategy="no", logging_strategy="no",
                             use_cpu=True, seed=0,
                             disable_tqdm=True, **kw)
    trainer = GNQTrainer(model=model, args=args, train_dataset=rows(),
                         data_collator=lm_collator(PAD_ID), gnq=GNQConfig(out=tmp_path / "shards", lam=1e-2))
    trainer.train()
    return pd.DataFrame(trainer.gnq.results).sort_values(["step", "batch_index", "example_id"])


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("reentrant", [True, False])
def test_trainer_gradient_checkpointing_gives_the_gnq_of_the_run_without_it(tmp_path, reentrant, lora):
    plain = trainer_gnq(tmp_path / "plain", lora)
    checkpointed = trainer_gnq(tmp_path / "ckpt", lora, activation_checkpointing=True,
                               activation_checkpointing_kwargs={"use_reentrant": reentrant})
    assert len(plain) == len(checkpointed) == 12
    assert plain["example_id"].tolist() == checkpointed["example_id"].tolist()
    assert rel_err(torch.tensor(checkpointed["gnq"].to_numpy()), torch.tensor(plain["gnq"].to_numpy())) <= TOL
