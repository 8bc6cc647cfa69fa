"""GNQTrainer keeps the user's objective: every loss option of the Trainer is kept (label
smoothing, the Trainer's own target count N and accumulation scaling) or refused in one line
(compute_loss_func), and the GNQ it records is exact for the objective stepped on."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from conftest import TOL, rel_err
from lm_fixtures import PAD_ID, lm_batch, texts, tiny_gpt2, tokenizer
from test_hf_trainer import RecordingTrainer
from transformers import Trainer, TrainingArguments

from gnq_core import GNQAuditor, per_example_lm_loss
from gnq_core.engine.math.reference import exact_gnq
from gnq_core.integrations.hf import GNQConfig, GNQTrainer, lm_collator
from gnq_core.sources.tokens import collate

LAM, EPS, N_ROWS = 1e-2, 0.1, 12


def rows() -> list[dict]:
    tok, pool = tokenizer(), texts()
    return [{"input_ids": tok.encode(pool[i]).ids[: 4 + (3 * i) % 11], "example_id": 100 + i}
            for i in range(N_ROWS)]


def args(tmp_path, **kw) -> TrainingArguments:
    kw = {"per_device_train_batch_size": 3, "gradient_accumulation_steps": 2, **kw}
    return TrainingArguments(output_dir=str(tmp_path / "out"), num_train_epochs=1, learning_rate=1e-2,
                             report_to=[], save_strategy="no", use_cpu=True, logging_strategy="no",
                             seed=0, disable_tqdm=True, optim="sgd", **kw)


def stock_collator(batch):  # the stock Trainer drops example_id (not a forward argument)
    b = collate([r["input_ids"] for r in batch], range(len(batch)), PAD_ID)
    return {"input_ids": b.input_ids, "attention_mask": b.attention_mask, "labels": b.labels}


def test_per_example_smoothed_loss_is_the_label_smoother_and_its_gnq_is_exact():
    """ℓ_j with ε is transformers' LabelSmoother per example (Σ_j n_j ℓ_j / N is its loss), and
    the auditor's GNQ of it equals explicit per-example gradients (reference, float64)."""
    from transformers.trainer_pt_utils import LabelSmoother

    torch.manual_seed(0)
    model = tiny_gpt2()
    batch = lm_batch([9, 4, 7, 6])
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    losses = per_example_lm_loss(out.logits, batch["labels"], label_smoothing=EPS)
    n = (batch["labels"][:, 1:] != -100).sum(1).to(losses.dtype)
    stock = LabelSmoother(epsilon=EPS)(out, batch["labels"], shift_labels=True)
    assert abs(((losses * n).sum() / n.sum()).item() - stock.item()) <= 1e-6 * stock.item()  # its fp32 sum
    plain = per_example_lm_loss(out.logits, batch["labels"])
    assert (losses - plain).abs().max() > 1e-3  # the smoothing is in ℓ_j

    def loss_fn(m, b):
        o = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
        return per_example_lm_loss(o.logits, b["labels"], label_smoothing=EPS)

    model.zero_grad()
    with GNQAuditor(model, lam=LAM) as auditor:
        loss_fn(model, batch).sum().backward()
        res = auditor.compute()
    ref = exact_gnq(model, loss_fn, batch, LAM)
    assert rel_err(res.gnq, ref.gnq) <= TOL
    unsmoothed = exact_gnq(model, lambda m, b: per_example_lm_loss(
        m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits, b["labels"]), batch, LAM)
    assert rel_err(unsmoothed.gnq, ref.gnq) > 1e-4  # a GNQ of the unsmoothed loss would fail above


def test_label_smoothing_updates_match_the_stock_trainer_and_gnq_is_of_the_smoothed_loss(tmp_path):
    """label_smoothing_factor=0.1: the weights after training equal the stock Trainer's (SGD, so a
    dropped term shows: it moved them by 6.8e-3), and each micro-batch's GNQ equals the direct
    auditor's on the smoothed per-example losses."""
    torch.manual_seed(0)
    model = tiny_gpt2()
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = RecordingTrainer(model=model, args=args(tmp_path, label_smoothing_factor=EPS),
                        train_dataset=rows(), data_collator=lm_collator(PAD_ID),
                        gnq=GNQConfig(out=tmp_path / "shards", lam=LAM, gnq_batch="micro-batch"))
    trainer.seen = []
    trainer.train()
    stock = tiny_gpt2()
    stock.load_state_dict(init, strict=False)
    Trainer(model=stock, args=args(tmp_path / "stock", label_smoothing_factor=EPS), train_dataset=rows(),
            data_collator=stock_collator).train()
    audited = dict(trainer.model.named_parameters())
    for n, p in stock.named_parameters():
        theirs, ours = p.detach() - init[n], audited[n].detach() - init[n]
        # the stock smoother sums −log p over the vocabulary in float32: agreement to its rounding
        assert (theirs - ours).abs().max() <= 1e-6 * theirs.abs().max(), n
    results = pd.DataFrame(trainer.gnq.results)
    for index, (batch, params) in enumerate(trainer.seen):
        m = tiny_gpt2()
        m.load_state_dict(params, strict=False)
        with GNQAuditor(m, lam=LAM) as auditor:
            out = m(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            losses = per_example_lm_loss(out.logits, batch["labels"], label_smoothing=EPS)
            losses.sum().backward()
            ref = auditor.compute()
        got = results[results["batch_index"] == index]
        assert rel_err(torch.tensor(got["gnq"].tolist()), ref.gnq) <= TOL
        assert rel_err(torch.tensor(got["loss"].tolist()), losses.detach()) <= TOL


@pytest.mark.parametrize("accepts", [True, False])
def test_the_trainers_own_target_count_and_accumulation_scaling(tmp_path, accepts):
    """A model whose forward takes no loss kwargs gets no N from the Trainer: the stock loss is
    each micro-batch's token mean divided by the accumulation steps, and GNQTrainer's is too."""
    torch.manual_seed(0)
    model = tiny_gpt2()
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = GNQTrainer(model=model, args=args(tmp_path), train_dataset=rows(),
                         data_collator=lm_collator(PAD_ID),
                         gnq=GNQConfig(out=tmp_path / "shards", lam=LAM, gnq_batch="micro-batch"))
    stock = tiny_gpt2()
    stock.load_state_dict(init, strict=False)
    reference = Trainer(model=stock, args=args(tmp_path / "stock"), train_dataset=rows(),
                        data_collator=stock_collator)
    trainer.model_accepts_loss_kwargs = reference.model_accepts_loss_kwargs = accepts
    trainer.train()
    reference.train()
    audited = dict(trainer.model.named_parameters())
    for n, p in stock.named_parameters():
        theirs, ours = p.detach() - init[n], audited[n].detach() - init[n]
        assert (theirs - ours).abs().max() <= 1e-5 * theirs.abs().max(), n  # the model's fp32 loss


def test_compute_loss_func_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="compute_loss_func") as info:
        GNQTrainer(model=tiny_gpt2(), args=args(tmp_path), train_dataset=rows(),
                   data_collator=lm_collator(PAD_ID), compute_loss_func=lambda o, y, **k: o.logits.sum(),
                   gnq=GNQConfig(out=tmp_path / "shards"))
    assert "\n" not in str(info.value)
    assert not (tmp_path / "shards").exists()


def _sft(tmp_path, **config):
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from gnq_core.sources.models import train_tokenizer

    pool = list(texts()[:18])
    tok = train_tokenizer(pool, vocab_size=320)
    data = datasets.Dataset.from_dict({"prompt": [t[:30] for t in pool[:9]],
                                       "completion": [" " + t[30:60] for t in pool[:9]],
                                       "example_id": list(range(100, 109))})
    settings = {"per_device_train_batch_size": 3, "max_steps": 3, "max_length": 32} | config
    args = trl.SFTConfig(output_dir=str(tmp_path / "out"),
                         activation_checkpointing=True,  # TRL's default, named as transformers 5 asks
                         learning_rate=1e-2, optim="sgd", report_to=[],
                         save_strategy="no", logging_strategy="no", use_cpu=True, bf16=False, seed=0,
                         disable_tqdm=True, dataset_num_proc=None, **settings)
    return trl, tok, data, args


def test_sft_label_smoothing_matches_trl_and_dft_is_refused(tmp_path):
    import warnings

    trl, tok, data, args = _sft(tmp_path, label_smoothing_factor=EPS)
    from gnq_core.integrations.trl import GNQSFTTrainer

    torch.manual_seed(0)
    model = tiny_gpt2(vocab_size=len(tok))
    model.config.pad_token_id = tok.pad_token_id
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    stock = copy_of(model, init, tok)
    with warnings.catch_warnings():  # TRL's note that the user's option is deprecated there
        warnings.filterwarnings("ignore", message=".*label_smoothing_factor.*")
        GNQSFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok,
                      gnq=GNQConfig(out=tmp_path / "shards", lam=LAM)).train()
        trl.SFTTrainer(model=stock, args=_sft(tmp_path / "stock", label_smoothing_factor=EPS)[3],
                       train_dataset=data.remove_columns("example_id"), processing_class=tok).train()
    ours = dict(model.named_parameters())
    for n, p in stock.named_parameters():
        theirs, mine = p.detach() - init[n], ours[n].detach() - init[n]
        assert (theirs - mine).abs().max() <= 1e-5 * theirs.abs().max(), n
    with pytest.raises(ValueError, match="loss_type='dft'") as info:
        GNQSFTTrainer(model=tiny_gpt2(vocab_size=len(tok)), args=_sft(tmp_path / "dft", loss_type="dft")[3],
                      train_dataset=data, processing_class=tok, gnq=GNQConfig(out=tmp_path / "dft-shards"))
    assert "\n" not in str(info.value) and not (tmp_path / "dft-shards").exists()


def copy_of(model, init, tok):
    twin = tiny_gpt2(vocab_size=len(tok))
    twin.config.pad_token_id = tok.pad_token_id
    twin.load_state_dict(init, strict=False)
    return twin
