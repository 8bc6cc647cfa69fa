"""GNQTrainer (Hugging Face Trainer + GNQ) with gradient accumulation, its shards, and `gnq ingest`."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from conftest import TOL, rel_err
from lm_fixtures import PAD_ID, texts, tiny_gpt2, tokenizer
from transformers import Trainer, TrainingArguments
from typer.testing import CliRunner

from gnq_core import GNQAuditor, per_example_lm_loss
from gnq_core.cli import app
from gnq_core.engine.sketch.projection import SketchSpec
from gnq_core.integrations.hf import GNQConfig, GNQTrainer, lm_collator
from gnq_core.results.records import RunSpec, batch_results
from gnq_core.results.shards import ShardStore, ShardWriter, new_shard_folder, open_store
from gnq_core.results.store import Store
from gnq_core.sources.tokens import collate

LAM = 1e-2
N_ROWS = 12


def rows() -> list[dict]:
    tok = tokenizer()
    pool = texts()
    return [{"input_ids": tok.encode(pool[i]).ids[: 4 + (3 * i) % 11], "example_id": 100 + i}
            for i in range(N_ROWS)]


def training_args(tmp_path, **kw) -> TrainingArguments:
    kw = {"per_device_train_batch_size": 3, "gradient_accumulation_steps": 2, "logging_strategy": "no", **kw}
    return TrainingArguments(output_dir=str(tmp_path / "out"), num_train_epochs=1, learning_rate=1e-2,
                             report_to=[], save_strategy="no", use_cpu=True,
                             seed=0, disable_tqdm=True, optim="sgd", **kw)


class RecordingTrainer(GNQTrainer):
    """Keeps each micro-batch and the weights it was audited at, for the direct computation."""

    seen: list

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            self.seen.append(({k: v.clone() for k, v in inputs.items()},
                              {n: p.detach().clone() for n, p in self.model.named_parameters()}))
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    # restored at the module's end: a leaked float64 default made later in-process `gnq train`
    # calls draw their initial weights in float64 (test_secret_attack then trained differently)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield _train(tmp_path_factory)
    finally:
        torch.set_default_dtype(previous)


def _train(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    model = tiny_gpt2()
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    pool = texts()
    trainer = RecordingTrainer(model=model, args=training_args(tmp), train_dataset=rows(),
                               data_collator=lm_collator(PAD_ID),
                               gnq=GNQConfig(out=tmp / "shards", lam=LAM, name="hf-run",
                                             texts={100 + i: pool[i] for i in range(N_ROWS)},
                                             gnq_batch="micro-batch"))
    trainer.seen = []
    trainer.train()
    return tmp, trainer, init


def test_gnq_per_micro_batch_equals_direct_auditor(trained):
    _, trainer, _ = trained
    results = pd.DataFrame(trainer.gnq.results)
    assert len(trainer.seen) == 4  # 12 rows, micro-batches of 3: two steps of two micro-batches
    assert results["step"].tolist() == [1] * 6 + [2] * 6
    assert results["batch_index"].tolist() == [i // 3 for i in range(12)]
    assert sorted(results["example_id"]) == [100 + i for i in range(N_ROWS)]
    for index, (batch, params) in enumerate(trainer.seen):
        model = tiny_gpt2()
        model.load_state_dict(params, strict=False)
        with GNQAuditor(model, lam=LAM) as auditor:  # the plain sum of ℓ_j: no weights at all
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            losses = per_example_lm_loss(out.logits, batch["labels"])
            losses.sum().backward()
            ref = auditor.compute()
        rows_ = results[results["batch_index"] == index]
        assert rows_["example_id"].tolist() == batch["example_id"].tolist()
        assert rel_err(torch.tensor(rows_["gnq"].tolist()), ref.gnq) <= TOL
        assert rel_err(torch.tensor(rows_["self_influence"].tolist()), ref.self_influence) <= TOL
        assert rel_err(torch.tensor(rows_["loss"].tolist()), losses.detach()) <= TOL


@pytest.mark.parametrize(("micro", "accumulation", "mode"),
                         [(2, 2, "exact"), (1, 3, "exact"), (2, 2, "sketch"), (4, 1, "auto")])
def test_gnq_per_optimizer_step_is_the_windows_batch(tmp_path, micro, accumulation, mode):
    """The default batch of the GNQ is the optimizer step: each window's GNQ equals the exact GNQ
    of its micro × accumulation texts audited as one batch (exact mode, ≤ 1e-9; micro-batches of
    1 work); sketch mode records its k and seed; run.json states B_eff and the mode."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        model = tiny_gpt2()
        data = rows()
        spec = SketchSpec(k=10**6, vocab_rows=10**6, seed=5)  # identity sketch: exact numbers
        args = training_args(tmp_path, per_device_train_batch_size=micro,
                             gradient_accumulation_steps=accumulation)
        config = GNQConfig(out=tmp_path / "shards", lam=LAM, window_mode=mode, sketch=spec)
        trainer = RecordingTrainer(model=model, args=args, train_dataset=data,
                                   data_collator=lm_collator(PAD_ID), gnq=config)
        trainer.seen = []
        trainer.train()
        results = pd.DataFrame(trainer.gnq.results)
        B_eff = micro * accumulation
        assert results["batch_index"].tolist() == [i // B_eff for i in range(N_ROWS)]
        by_id = {r["example_id"]: r for r in data}
        for window in range(N_ROWS // B_eff):
            ids = results[results["batch_index"] == window]["example_id"].tolist()
            params = trainer.seen[window * accumulation][1]  # θ at the window's first micro-batch
            ref_model = tiny_gpt2()
            ref_model.load_state_dict(params, strict=False)
            batch = lm_collator(PAD_ID)([by_id[i] for i in ids])
            with GNQAuditor(ref_model, lam=LAM) as auditor:
                out = ref_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
                per_example_lm_loss(out.logits, batch["labels"]).sum().backward()
                ref = auditor.compute()
            got = results[results["batch_index"] == window]
            assert rel_err(torch.tensor(got["gnq"].tolist()), ref.gnq) <= TOL
            assert rel_err(torch.tensor(got["self_influence"].tolist()), ref.self_influence) <= TOL
        frame = open_store(tmp_path / "shards").batches(1)
        assert frame["size"].tolist() == [B_eff] * (N_ROWS // B_eff)
        assert set(frame["gnq_mode"]) == {"exact" if mode == "auto" else mode}
        assert set(frame["sketch_k"].dropna()) == ({10**6} if mode == "sketch" else set())
        meta = json.loads((tmp_path / "shards" / "run.json").read_text())
        run = meta["run"]
        assert run["batch_size"] == B_eff and run["settings"]["b_eff"] == B_eff
        assert run["settings"]["gnq_mode"] == mode and "optimizer step" in run["settings"]["gnq_batch"]
        # a window of one micro-batch (no accumulation, one process) is audited as that batch, fused
        one = accumulation == 1
        assert (run["settings"]["weight_gradients"] == "fused") == one
        assert ("gnq_path" in run["settings"]) == one
    finally:
        torch.set_default_dtype(previous)


def test_window_of_one_text_gets_no_gnq(tmp_path):
    """A last window of one text (13 rows, windows of 4) has no companions: NULL, counted."""
    data = [*rows(), {"input_ids": rows()[0]["input_ids"], "example_id": 999}]
    trainer = GNQTrainer(model=tiny_gpt2(), args=training_args(tmp_path, per_device_train_batch_size=2,
                                                                 gradient_accumulation_steps=2,
                                                                 logging_strategy="steps", logging_steps=1),
                         train_dataset=data, data_collator=lm_collator(PAD_ID),
                         gnq=GNQConfig(out=tmp_path / "shards", lam=LAM, window_mode="exact"))
    trainer.train()
    results = pd.DataFrame(trainer.gnq.results)
    last = results[results["batch_index"] == results["batch_index"].max()]
    assert len(last) == 1 and last["gnq"].isna().all() and last["self_influence"].notna().all()
    assert trainer.gnq.windows_without_gnq == 1
    meta = json.loads((tmp_path / "shards" / "run.json").read_text())
    assert meta["windows_without_gnq"] == 1
    logged = [h for h in trainer.state.log_history if "gnq/b_eff" in h]  # the Trainer's own logs
    assert logged and all(h["gnq/b_eff"] == 4 for h in logged)
    assert logged[-1]["gnq/windows_without_gnq"] == 1


def test_training_matches_the_stock_trainer(trained, tmp_path):
    _, trainer, init = trained
    torch.manual_seed(0)
    model = tiny_gpt2()
    model.load_state_dict(init, strict=False)

    def stock_collator(batch):  # the stock Trainer drops example_id (not a forward argument)
        b = collate([r["input_ids"] for r in batch], range(len(batch)), PAD_ID)
        return {"input_ids": b.input_ids, "attention_mask": b.attention_mask, "labels": b.labels}

    Trainer(model=model, args=training_args(tmp_path), train_dataset=rows(),
            data_collator=stock_collator).train()
    # SGD, so a loss of another scale would show (Adam would normalise it away).  The model's own
    # loss upcasts logits with .float(), i.e. runs in float32 even for this float64 model: the
    # updates agree to float32 rounding.
    audited = dict(trainer.model.named_parameters())
    for n, p in model.named_parameters():
        stock, ours = p.detach() - init[n], audited[n].detach() - init[n]
        assert (stock - ours).abs().max() <= 1e-5 * stock.abs().max(), n
    assert model.transformer.wte.weight.sub(init["transformer.wte.weight"]).abs().max() > 1e-4


def test_shards_read_in_place_and_ingest_idempotently(trained, tmp_path):
    tmp, trainer, _ = trained
    shards = tmp / "shards"
    direct = open_store(shards)
    assert isinstance(direct, ShardStore)
    run = direct.run("hf-run")
    assert run.status == "done" and run.settings["gradient_accumulation_steps"] == 2
    scores = direct.scores(run.run_id)
    mine = pd.DataFrame(trainer.gnq.results).sort_values("example_id")
    assert scores["gnq"].tolist() == mine["gnq"].tolist()
    assert direct.example_totals(run.run_id)["text"].str.len().min() > 0
    db = tmp_path / "gnq.duckdb"
    runner = CliRunner()
    first = runner.invoke(app, ["ingest", str(shards), "--db", str(db), "-q"])
    assert first.exit_code == 0, first.output
    before = _snapshot(db)
    second = runner.invoke(app, ["ingest", str(shards), "--db", str(db), "-q"])
    assert second.exit_code == 0, second.output
    assert _snapshot(db) == before
    stored = Store(db)
    assert len(stored.runs()) == 1
    pd.testing.assert_frame_equal(stored.scores(stored.run("hf-run").run_id).drop(columns="run_id"),
                                  scores.drop(columns="run_id"), check_dtype=False)


def _snapshot(db) -> dict:
    store = Store(db)
    with store.connect(read_only=True) as con:
        return {t: con.execute(f"SELECT * EXCLUDE (run_id) FROM {t} ORDER BY ALL").fetchall()
                for t in ("examples", "points", "scores", "batches")} | {
            "runs": con.execute("SELECT run_id, name, status FROM runs").fetchall()}


def two_rank_shards(root) -> None:
    """A small shards folder as two ranks would write it (one example twice: sampler padding)."""
    run = RunSpec(name="two-ranks", kind="train", lam=LAM, batch_size=2, seed=0, max_length=16,
                  model_path="m", dataset_path="d", dataset_hash="h", n_examples=6, code_version="t")
    examples = pd.DataFrame({"example_id": range(6), "text": [f"t{i}" for i in range(6)], "grp": None,
                             "n_tokens": 5})
    new_shard_folder(root, run, examples, world_size=2)
    for rank in range(2):
        w = ShardWriter(root, rank, 2)
        for step in (1, 2):
            ids = [(2 * (step - 1) + rank) % 6, (2 * (step - 1) + rank + 4) % 6]
            texts, batch = batch_results(ids, [2.0, 2.0], [1.0 + e for e in ids], [3.0, 3.0],
                                         batch_index=2 * (step - 1) + rank, step=step, condition=10.0,
                                         finite=True, seconds=0.1)
            w.add(step, 0, texts, [batch])
        w.flush()


def test_ingest_refuses_partial_or_bad_shards_and_leaves_the_store_unchanged(tmp_path):
    runner = CliRunner()
    good, db = tmp_path / "good", tmp_path / "gnq.duckdb"
    two_rank_shards(good)
    assert runner.invoke(app, ["ingest", str(good), "--db", str(db), "-q"]).exit_code == 0
    scores = Store(db).scores(Store(db).run("two-ranks").run_id)
    assert scores["example_id"].is_unique and len(scores) == 6  # the repeated example kept once
    before = _snapshot(db)

    partial = tmp_path / "partial"
    two_rank_shards(partial)
    next((partial / "scores").glob("rank-00001.*")).unlink()
    bad = tmp_path / "bad"
    two_rank_shards(bad)
    next((bad / "batches").glob("rank-00000.*")).write_bytes(b"not parquet at all")
    for folder, message in ((partial, "incomplete: rank 1 has no scores shard"),
                            (bad, "not a readable Parquet file")):
        out = runner.invoke(app, ["ingest", str(folder), "--db", str(db)])
        assert out.exit_code == 1
        assert message in out.output and len(out.output.strip().splitlines()) == 1, out.output
        assert _snapshot(db) == before
    out = runner.invoke(app, ["ingest", str(tmp_path / "nowhere"), "--db", str(db)])
    assert out.exit_code == 1 and "no such shards folder" in out.output


def test_shard_folder_is_not_reused(tmp_path):
    two_rank_shards(tmp_path / "s")
    with pytest.raises(Exception, match="already holds"):
        two_rank_shards(tmp_path / "s")


def test_gnq_summaries_reach_the_trainers_own_logs(tmp_path):
    """Every training log (what W&B, TensorBoard or MLflow receive) carries GNQ's median,
    p99, count above the flag threshold and top text ids over the micro-batches since the last log."""
    from transformers import TrainerCallback

    class Seen(TrainerCallback):  # what a report_to integration's on_log receives
        logs: list = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            Seen.logs.append(dict(logs))

    torch.manual_seed(0)
    pool = texts()
    args = training_args(tmp_path).to_dict() | {"logging_strategy": "steps", "logging_steps": 1}
    args = {k: v for k, v in args.items() if k in TrainingArguments.__dataclass_fields__ and
            TrainingArguments.__dataclass_fields__[k].init}
    trainer = GNQTrainer(model=tiny_gpt2().double(), args=TrainingArguments(**args), train_dataset=rows(),
                         data_collator=lm_collator(PAD_ID), callbacks=[Seen()],
                         gnq=GNQConfig(out=tmp_path / "shards", lam=LAM, flag_gnq=1.5,
                                       texts={100 + i: pool[i] for i in range(N_ROWS)}))
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 2 and all("gnq/median" in h for h in steps)  # 12 rows / (3 x 2 accumulated)
    results = pd.DataFrame(trainer.gnq.results)
    for h, (_, window) in zip(steps, results.groupby("step"), strict=True):
        assert h["gnq/median"] == pytest.approx(window["gnq"].median())
        assert h["gnq/p99"] == pytest.approx(window["gnq"].quantile(0.99))
        assert h["gnq/threshold"] == 1.5 and h["gnq/above_threshold"] == int((window["gnq"] > 1.5).sum())
        assert h["gnq/top1_example_id"] == window.loc[window["gnq"].idxmax(), "example_id"]
    assert [s for s in Seen.logs if "gnq/median" in s] == [{k: v for k, v in h.items() if k != "step"}
                                                           for h in steps]
