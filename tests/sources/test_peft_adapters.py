"""PEFT (LoRA) runs audited post hoc.  A Trainer run of a PeftModel saves adapter
checkpoints (adapter_config.json + adapter_model.safetensors); ``gnq audit --base-model`` audits
them over the adapter's parameters — the quantity GNQTrainer measures in-run — so the post-hoc GNQ
of checkpoint-k equals the in-run GNQ of step k+1 (the same texts at the same weights), in float64.
Skipped only where peft is not installed (it is an optional extra: gnq-audit[peft])."""

from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import TOL, rel_err
from lm_fixtures import texts, tiny_gpt2, tiny_llama
from transformers import TrainingArguments
from typer.testing import CliRunner

from gnq_core import per_example_lm_loss
from gnq_core.cli import app
from gnq_core.engine import gnq_from_kernel
from gnq_core.engine.math.reference import per_example_gradients
from gnq_core.integrations.hf import GNQConfig, GNQTrainer, lm_collator
from gnq_core.results.store import Store
from gnq_core.sources.adapters import Adapters, load_adapter_checkpoint
from gnq_core.sources.checkpoints.save import save_checkpoint
from gnq_core.sources.models import train_tokenizer
from gnq_core.sources.tokens import collate, encode_texts, pad_id

peft = pytest.importorskip("peft")

LAM, MAX_LENGTH, N_TEXTS, STEPS = 1e-2, 24, 4, 3
ROOT = Path(__file__).resolve().parents[2]


def lora(model: torch.nn.Module) -> torch.nn.Module:
    config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                             init_lora_weights=False)  # B ≠ 0: the adapter changes the model from step 1
    return peft.get_peft_model(model, config)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield _train(tmp_path_factory.mktemp("lora"))
    finally:
        torch.set_default_dtype(previous)


def _train(tmp):
    pool = list(texts()[:N_TEXTS])
    tok = train_tokenizer(list(texts()), vocab_size=320)
    torch.manual_seed(0)
    base = tiny_llama(vocab_size=len(tok))
    save_checkpoint(base, tok, tmp / "base")
    model = lora(copy.deepcopy(base))
    out = tmp / "out"
    model.save_pretrained(out / "checkpoint-0")  # the adapter before training: step 1's weights
    rows = [{"input_ids": ids, "example_id": i} for i, ids in enumerate(encode_texts(tok, pool, MAX_LENGTH))]
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=N_TEXTS, max_steps=STEPS,
                             learning_rate=0.5, optim="sgd", report_to=[], save_strategy="steps",
                             save_steps=1, logging_strategy="no", use_cpu=True, seed=0, disable_tqdm=True)
    trainer = GNQTrainer(model=model, args=args, train_dataset=rows, data_collator=lm_collator(pad_id(tok)),
                         gnq=GNQConfig(out=tmp / "shards", lam=LAM, texts=pool))
    trainer.train()
    pd.DataFrame({"text": pool}).to_csv(tmp / "texts.csv", index=False)
    return tmp, trainer, tok, pool


def audit(tmp, name, *extra):
    args = ["audit", "--checkpoints", str(tmp / "out"), "--data", str(tmp / "texts.csv"), "--db",
            str(tmp / f"{name}.duckdb"), "--name", name, "--lam", str(LAM), "--batch-size", str(N_TEXTS),
            "--max-length", str(MAX_LENGTH), "--dtype", "float64", "--quiet", *extra]
    return CliRunner().invoke(app, args)


def test_lora_run_audited_post_hoc_equals_its_in_run_gnq(lora_run):
    tmp, trainer, _, _ = lora_run
    out = audit(tmp, "post", "--base-model", str(tmp / "base"))
    assert out.exit_code == 0, out.output
    store = Store(tmp / "post.duckdb")
    run = store.run("post")
    assert run.settings["base_model"] == str((tmp / "base").resolve())
    assert run.settings["parameters"] == "adapter"
    points = store.points(run.run_id).set_index("point")["label"].tolist()
    assert points == [f"checkpoint-{k}" for k in range(STEPS + 1)]
    scores = store.scores(run.run_id)
    inrun = pd.DataFrame(trainer.gnq.results)
    assert sorted(inrun["step"].unique()) == list(range(1, STEPS + 1))
    for k in range(STEPS):  # checkpoint-k holds the weights step k+1 was audited at
        post = scores[scores["point"] == k].set_index("example_id")["gnq"].sort_index()
        live = inrun[inrun["step"] == k + 1].set_index("example_id")["gnq"].sort_index()
        assert list(post.index) == list(live.index) == list(range(N_TEXTS))
        err = rel_err(torch.tensor(post.to_numpy()), torch.tensor(live.to_numpy()))
        print(f"checkpoint-{k} vs in-run step {k + 1}: rel. error {err:.2e}")
        assert err <= TOL, k
    # the attack decodes with each adapter merged into the base (the reference: checkpoint-0's)
    attack = CliRunner().invoke(app, ["extract", "--run", "post", "--db", str(tmp / "post.duckdb"),
                                      "--prefix-tokens", "4", "--suffix-tokens", "4", "--quiet"])
    assert attack.exit_code == 0, attack.output
    assert len(store.extractions(run.run_id)) == N_TEXTS
    # the quantity is the adapter's: far from GNQ over every parameter of the merged model
    merged = audit(tmp, "merged", "--base-model", str(tmp / "base"), "--merge-adapter")
    assert merged.exit_code == 0, merged.output
    other = Store(tmp / "merged.duckdb")
    assert other.run("merged").settings["parameters"] == "merged model"
    m = other.scores(other.run("merged").run_id).query("point == 0").sort_values("example_id")["gnq"]
    p = scores.query("point == 0").sort_values("example_id")["gnq"]
    assert rel_err(torch.tensor(m.to_numpy()), torch.tensor(p.to_numpy())) > 1e-3


@pytest.mark.parametrize("merged", [False, True])
def test_adapter_checkpoint_gnq_equals_explicit_per_example_gradients(lora_run, merged):
    """GNQ of a loaded adapter checkpoint against explicit per-example gradients (float64) over the
    same parameters: the adapter's, or all of the merged model's."""
    from gnq_core.pipelines.audit import audit_batches

    tmp, _, tok, pool = lora_run
    torch.manual_seed(5)
    model, _ = load_adapter_checkpoint(tmp / "out" / "checkpoint-2", Adapters(tmp / "base", merged=merged),
                                       dtype=torch.float64)
    params = [p for p in model.parameters() if p.requires_grad]
    n_all = sum(p.numel() for p in model.parameters())
    assert (sum(p.numel() for p in params) == n_all) == merged
    order = torch.randperm(N_TEXTS).tolist()
    batch = collate(encode_texts(tok, [pool[i] for i in order], MAX_LENGTH), order, pad_id(tok))
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    G = per_example_gradients(per_example_lm_loss(logits, batch.labels), params)
    expected = gnq_from_kernel(G @ G.T, LAM).gnq
    model.zero_grad(set_to_none=True)
    columns, _ = audit_batches(model, [batch], LAM, torch.device("cpu"), trainable_only=not merged)
    got = pd.concat(columns.frames(0)).set_index("example_id").loc[order, "gnq"].to_numpy()
    assert rel_err(torch.tensor(got), expected) <= TOL


def test_adapter_mistakes_are_one_line(lora_run, tmp_path):
    tmp, _, tok, _ = lora_run
    runner = CliRunner()

    def fails(*extra, name="bad"):
        db = tmp_path / f"{name}.duckdb"
        out = runner.invoke(app, ["audit", "--checkpoints", str(tmp / "out"), "--data",
                                  str(tmp / "texts.csv"), "--db", str(db), "--name", name, "--batch-size",
                                  str(N_TEXTS), "--max-length", str(MAX_LENGTH), *extra])
        assert out.exit_code == 1, out.output
        lines = out.output.strip().splitlines()
        assert len(lines) == 1, out.output
        if db.exists():
            assert not Store(db).runs()["name"].eq(name).any()
        return lines[0]

    assert "holds PEFT adapter checkpoints (adapter_config.json)" in fails()
    assert "--base-model PATH" in fails()
    assert "no such" in fails("--base-model", str(tmp_path / "nowhere")).lower()
    other = tmp_path / "gpt2-base"
    torch.manual_seed(0)
    save_checkpoint(tiny_gpt2(vocab_size=len(tok)), tok, other)
    line = fails("--base-model", str(other))
    assert "does not fit the base model" in line and "checkpoint-" in line
    wider = tmp_path / "wider-base"
    cfg = tiny_llama(vocab_size=len(tok)).config
    cfg.hidden_size, cfg.intermediate_size = 32, 64
    from transformers import LlamaForCausalLM

    save_checkpoint(LlamaForCausalLM(cfg), tok, wider)
    assert "has other shapes for" in fails("--base-model", str(wider))
    assert "--merge-adapter applies to adapter checkpoints" in fails("--merge-adapter")


def test_new_audit_page_names_the_base_of_adapter_checkpoints(lora_run, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    tmp, _, tok, _ = lora_run
    monkeypatch.setenv("GNQ_DB", str(tmp_path / "gnq.duckdb"))
    at = AppTest.from_file(str(ROOT / "gnq_core" / "dashboard" / "views" / "new_audit.py"),
                           default_timeout=60)
    at.run()
    at.radio(key="ckpt_mode").set_value("Local path").run()
    at.text_input(key="ckpt_path").set_value(str(tmp / "out")).run()
    def error() -> str:
        return at.error[0].value.replace("\\", "") if at.error else ""  # the page escapes Markdown

    assert "holds PEFT adapter checkpoints" in error()  # the cause, not "no config.json"
    at.radio(key="base_mode").set_value("Local path").run()
    at.text_input(key="base_path").set_value(str(tmp / "base")).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert f"{STEPS + 1} adapter checkpoint(s)" in "\n".join(c.value for c in at.caption)
    other = tmp_path / "gpt2-base"
    torch.manual_seed(0)
    save_checkpoint(tiny_gpt2(vocab_size=len(tok)), tok, other)
    at.text_input(key="base_path").set_value(str(other)).run()
    assert "does not fit the base model" in error()
