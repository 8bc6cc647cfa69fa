"""TRL's SFTTrainer with in-run GNQ (GNQSFTTrainer), offline on a tiny local model and
a datasets.Dataset: completion-only loss, GNQ of every micro-batch equal to explicit per-example
gradients (float64) of the weights it was audited at; with packing, GNQ per packed document,
exact, over TRL's padding-free packed targets; packing that splits texts over rows refused at
setup in one line.
Skipped only where trl is not installed (an optional extra: gnq-audit[trl])."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from conftest import TOL, rel_err
from lm_fixtures import texts, tiny_gpt2

from gnq_core import per_example_lm_loss
from gnq_core.engine import gnq_from_kernel
from gnq_core.engine.math.reference import per_example_gradients
from gnq_core.integrations.hf import GNQConfig
from gnq_core.sources.models import train_tokenizer

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
from gnq_core.integrations.trl import GNQSFTTrainer  # noqa: E402  (needs trl)

LAM, N_ROWS = 1e-2, 9


class Recording(GNQSFTTrainer):
    """Keeps each micro-batch and the weights it was audited at, for the direct computation."""

    seen: list

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            self.seen.append(({k: v.clone() for k, v in inputs.items()},
                              {n: p.detach().clone() for n, p in model.named_parameters()}))
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def setup(tmp_path, **config):
    pool = list(texts()[: 2 * N_ROWS])
    tok = train_tokenizer(pool, vocab_size=320)
    torch.manual_seed(0)
    model = tiny_gpt2(vocab_size=len(tok))
    model.config.pad_token_id = tok.pad_token_id
    data = datasets.Dataset.from_dict({"prompt": [t[:30] for t in pool[:N_ROWS]],
                                       "completion": [" " + t[30:60] for t in pool[:N_ROWS]],
                                       "example_id": list(range(100, 100 + N_ROWS))})
    settings = dict(per_device_train_batch_size=3, max_steps=3, max_length=32) | config
    args = trl.SFTConfig(output_dir=str(tmp_path / "out"),
                         activation_checkpointing=True,  # TRL's default, named as transformers 5 asks
                         learning_rate=1e-2, optim="sgd", report_to=[],
                         save_strategy="no", logging_strategy="no", use_cpu=True, bf16=False, seed=0,
                         disable_tqdm=True, dataset_num_proc=None, **settings)
    return model, tok, data, args


@pytest.mark.parametrize("checkpointing", [False, True])
def test_sft_trainer_completion_only_gnq_equals_explicit_gradients(tmp_path, checkpointing):
    model, tok, data, args = setup(tmp_path, gradient_checkpointing=checkpointing)
    trainer = Recording(model=model, args=args, train_dataset=data, processing_class=tok,
                        gnq=GNQConfig(out=tmp_path / "shards", lam=LAM))
    trainer.seen = []
    trainer.train()
    results = pd.DataFrame(trainer.gnq.results)
    assert len(trainer.seen) == 3 and len(results) == 9
    # the same architecture, loaded with each step's weights (GPT-2: Llama's RMSNorm computes in float32,
    # so its weighted and unweighted gradients differ at float32 rounding, ~1e-8)
    reference = tiny_gpt2(vocab_size=len(tok))
    for step, (inputs, weights) in enumerate(trainer.seen, start=1):
        labels, mask = inputs["labels"], inputs["attention_mask"].bool()
        assert ((labels == -100) & mask).any(), "completion-only: prompt tokens carry no loss"
        reference.load_state_dict(weights, strict=False)  # lm_head is tied to wte
        reference.train()
        logits = reference(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
        params = [p for p in reference.parameters() if p.requires_grad]
        G = per_example_gradients(per_example_lm_loss(logits, labels), params)
        expected = gnq_from_kernel(G @ G.T, LAM).gnq
        ids = inputs["example_id"].tolist()
        got = results[results["step"] == step].set_index("example_id").loc[ids, "gnq"]
        assert rel_err(torch.tensor(got.to_numpy()), expected) <= TOL, step
    run = json.loads((tmp_path / "shards" / "run.json").read_text())["run"]
    assert run["settings"]["trainer"] == "trl.SFTTrainer (GNQSFTTrainer)"


def test_packing_gives_gnq_per_document_exactly(tmp_path):
    """packing=True (bfd): every micro-batch of packed rows is unpacked into its documents; GNQ per
    document equals explicit float64 gradients; each text is one document, seen once per epoch; the
    targets are TRL's padding-free packed ones (none across a document boundary)."""
    model, tok, data, args = setup(tmp_path, packing=True, max_length=96, max_steps=2,
                                   per_device_train_batch_size=2)
    trainer = Recording(model=model, args=args, train_dataset=data, processing_class=tok,
                        gnq=GNQConfig(out=tmp_path / "shards", lam=LAM))
    assert len(trainer.train_dataset) < N_ROWS  # several texts per packed row
    packed = list(trainer.train_dataset)
    trainer.seen = []
    trainer.train()
    results = pd.DataFrame(trainer.gnq.results)
    reference = tiny_gpt2(vocab_size=len(tok))
    sizes = []
    for step, (inputs, weights) in enumerate(trainer.seen, start=1):
        ids = inputs["example_id"].tolist()
        sizes.append(len(ids))
        reference.load_state_dict(weights, strict=False)
        reference.train()
        logits = reference(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
        G = per_example_gradients(per_example_lm_loss(logits, inputs["labels"]), list(reference.parameters()))
        expected = gnq_from_kernel(G @ G.T, LAM).gnq
        got = results[results["step"] == step].set_index("example_id").loc[ids, "gnq"]
        assert rel_err(torch.tensor(got.to_numpy()), expected) <= TOL, step
    assert max(sizes) > 2 and len(results["example_id"]) == len(set(results["example_id"]))
    # the targets are TRL's padding-free packed ones: the same tokens, none across a document boundary
    rows = [r for r in packed if set(r["gnq_example_ids"]) <= set(trainer.seen[0][0]["example_id"].tolist())]
    collator = trl.trainer.sft_trainer.DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id,
                                                                      padding_free=True)
    flat = collator([{k: r[k] for k in ("input_ids", "labels", "seq_lengths")} for r in rows])
    targets = flat["labels"][0, 1:][flat["labels"][0, 1:] != -100]
    inputs = trainer.seen[0][0]
    ours = inputs["labels"][:, 1:][inputs["labels"][:, 1:] != -100]
    assert len(rows) == 2 and sorted(targets.tolist()) == sorted(ours.tolist())


@pytest.mark.parametrize("config", [{"packing": True, "packing_strategy": "wrapped"},
                                    {"packing": True, "packing_strategy": "bfd_split"},
                                    {"padding_free": True}])
def test_what_splits_or_merges_texts_without_ids_is_refused_at_setup(tmp_path, config):
    model, tok, data, args = setup(tmp_path, **config)
    with pytest.raises(ValueError, match="GNQSFTTrainer: ") as err:
        GNQSFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok,
                      gnq=GNQConfig(out=tmp_path / "shards", lam=LAM))
    assert len(str(err.value).splitlines()) == 1 and not (tmp_path / "shards").exists()


def chat_setup(tmp_path, **config):
    """A ChatML tokenizer (with {% generation %}), a tiny GPT-2 and `messages` rows with ids."""
    from chat_fixtures import chat_tokenizer, sentence

    tok = chat_tokenizer("chatml")
    torch.manual_seed(0)
    model = tiny_gpt2(vocab_size=len(tok))
    model.config.pad_token_id = tok.pad_token_id
    rows = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Q{i}?"},
                          {"role": "assistant", "content": sentence(i, 5)}], "example_id": 200 + i}
            for i in range(6)]  # short enough for the tiny model's 64 positions: nothing truncated
    settings = dict(per_device_train_batch_size=3, max_steps=2, max_length=64) | config
    args = trl.SFTConfig(output_dir=str(tmp_path / "out"),
                         activation_checkpointing=True,  # TRL's default, named as transformers 5 asks
                         learning_rate=1e-2, optim="sgd", report_to=[],
                         save_strategy="no", logging_strategy="no", use_cpu=True, bf16=False, seed=0,
                         disable_tqdm=True, dataset_num_proc=None, **settings)
    return model, tok, datasets.Dataset.from_list(rows), args


@pytest.mark.parametrize("assistant_only", [False, True])
def test_sft_trainer_on_messages_is_exact_and_stores_the_conversations(tmp_path, assistant_only):
    """messages data with TRL's defaults (every token) and assistant_only_loss=True: GNQ equals
    explicit per-example gradients; the labels are the trained tokens the post-hoc reading
    (sources/chat.py) marks; the shards' examples hold the rendered text and its turns, as gnq audit
    stores them, and ingest into the store."""
    from gnq_core.results.shards import ingest
    from gnq_core.results.store import Store
    from gnq_core.sources.chat import ChatLayout

    model, tok, data, args = chat_setup(tmp_path, assistant_only_loss=assistant_only)
    trainer = Recording(model=model, args=args, train_dataset=data, processing_class=tok,
                        gnq=GNQConfig(out=tmp_path / "shards", lam=LAM))
    trainer.seen = []
    trainer.train()
    results = pd.DataFrame(trainer.gnq.results)
    reference = tiny_gpt2(vocab_size=len(tok))
    layouts = {e: r.layout for e, r in trainer.gnq.chat.items()}
    for step, (inputs, weights) in enumerate(trainer.seen, start=1):
        labels, ids = inputs["labels"], inputs["example_id"].tolist()
        for row, eid in enumerate(ids):
            n = int(inputs["attention_mask"][row].sum())
            mask = layouts[eid].trained_mask(n)
            tokens = inputs["input_ids"][row, :n].tolist()
            want = [t if m else -100 for t, m in zip(tokens, mask, strict=True)]
            assert labels[row, :n].tolist() == want
        reference.load_state_dict(weights, strict=False)
        reference.train()
        logits = reference(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
        G = per_example_gradients(per_example_lm_loss(logits, labels), list(reference.parameters()))
        expected = gnq_from_kernel(G @ G.T, LAM).gnq
        got = results[results["step"] == step].set_index("example_id").loc[ids, "gnq"]
        assert rel_err(torch.tensor(got.to_numpy()), expected) <= TOL, step
    store = Store(tmp_path / "gnq.duckdb")
    run, _ = ingest(store, tmp_path / "shards")
    examples = store.examples(run.run_id)
    layout = ChatLayout.from_json(examples["turns"].iloc[0])
    assert examples["text"].iloc[0].startswith("<|im_start|>system\nBe brief.")
    assert [t.trained for t in layout.turns] == ([False, False, True] if assistant_only else [True] * 3)
