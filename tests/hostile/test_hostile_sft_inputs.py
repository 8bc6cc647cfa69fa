"""GNQSFTTrainer with hostile inputs.  Its rows are keyed by each row's ``example_id``, which was
read with ``int()``: ids 0.5 and 0.9 both became 0 and two texts' GNQ rows one text's, two rows
given one id were stored without a word, a text id was a traceback.  Now a non-whole or repeated
id is refused in one line before the shards folder exists.  What held (tested so it stays): a
NaN weight stores GNQ as missing rather than failing, frozen and unused parameters train and are
audited over the others, a model with nothing to train is refused in one line."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from lm_fixtures import texts, tiny_gpt2

from gnq_core.integrations.hf import GNQConfig
from gnq_core.sources.models import train_tokenizer

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
from gnq_core.integrations.trl import GNQSFTTrainer  # noqa: E402  (needs trl)

POOL = list(texts()[:18])


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(POOL, vocab_size=320)


def train(tmp_path, tok, ids=None, change=None, **config):
    torch.manual_seed(0)
    model = tiny_gpt2(vocab_size=len(tok)).float()
    model.config.pad_token_id = tok.pad_token_id
    if change is not None:
        change(model)
    data = datasets.Dataset.from_dict({"prompt": [t[:30] for t in POOL[:6]],
                                       "completion": [" " + t[30:60] for t in POOL[:6]],
                                       "example_id": ids if ids is not None else list(range(6))})
    args = trl.SFTConfig(output_dir=str(tmp_path / "out"),
                         activation_checkpointing=True,  # TRL's default, named as transformers 5 asks
                         learning_rate=1e-2, optim="sgd", report_to=[],
                         save_strategy="no", logging_strategy="no", use_cpu=True, bf16=False, seed=0,
                         disable_tqdm=True, dataset_num_proc=None, per_device_train_batch_size=3, max_steps=2,
                         max_length=32, **config)
    trainer = GNQSFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok,
                            gnq=GNQConfig(out=tmp_path / "shards", lam=1e-2))
    trainer.train()
    return pd.DataFrame(trainer.gnq.results)


@pytest.mark.parametrize("ids,problem", [([0, 0, 1, 2, 3, 4], "'example_id' 0 is given to 2 rows"),
                                         ([0.5 * i for i in range(6)], "must hold whole numbers"),
                                         ([f"t{i}" for i in range(6)], "must hold whole numbers")])
@pytest.mark.parametrize("packing", [False, True])
def test_ids_that_are_not_one_whole_number_a_text_are_refused_before_anything_is_written(tmp_path, tok, ids,
                                                                                         problem, packing):
    with pytest.raises(ValueError) as caught:
        train(tmp_path, tok, ids, packing=packing)
    assert problem in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "shards").exists()


@pytest.mark.slow
def test_a_nan_weight_stores_gnq_as_missing(tmp_path, tok):
    rows = train(tmp_path, tok, change=lambda m: m.transformer.h[0].mlp.c_fc.weight.data.__setitem__(
        (0, 0), float("nan")))
    assert len(rows) == 6 and rows["gnq"].isna().all()


@pytest.mark.slow
def test_frozen_and_unused_parameters_are_left_out_and_nothing_to_train_is_refused(tmp_path, tok):
    def frozen(model):
        model.register_parameter("unused", torch.nn.Parameter(torch.zeros(3)))  # gets no gradient
        for name, p in model.named_parameters():
            p.requires_grad_("wpe" not in name)

    rows = train(tmp_path / "a", tok, change=frozen)
    assert len(rows) == 6 and rows["gnq"].notna().all()
    with pytest.raises(ValueError, match="no trainable parameters"):
        train(tmp_path / "b", tok, change=lambda m: [p.requires_grad_(False) for p in m.parameters()])
