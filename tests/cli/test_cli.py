"""End to end through the `gnq` command: train → audit → extract → export, checked against a
direct GNQAuditor computation; input formats; clear errors.  (Resuming after a kill -9:
tests/hostile/test_hostile_crash.py.)"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import rel_err
from lm_fixtures import texts
from typer.testing import CliRunner

from gnq_core import GNQAuditor, per_example_lm_loss
from gnq_core.analysis.verdict import rank_texts
from gnq_core.cli import app
from gnq_core.pipelines.resume import TRAINER_STATE
from gnq_core.results.store import Store
from gnq_core.sources.checkpoints.load import load_checkpoint
from gnq_core.sources.copies import find_copies
from gnq_core.sources.tokens import batch_partition, collate, encode_texts, pad_id

pytestmark = pytest.mark.slow
runner = CliRunner()


def gnq(*args: str) -> str:
    result = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def fails(*args: str) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    return result.output


@pytest.fixture(scope="module")
def dataset_csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "news.csv"
    rows = list(texts(40))
    groups = ["business" if i % 2 else "world" for i in range(len(rows))]
    pd.DataFrame({"text": rows, "group": groups}).to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory, dataset_csv):
    """One small from-scratch training run, shared by the tests of this module."""
    root = tmp_path_factory.mktemp("run")
    db, out = root / "gnq.duckdb", root / "tiny"
    gnq("train", "--data", dataset_csv, "--from-scratch", "--preset", "tiny", "--epochs", 2,
        "--batch-size", 8, "--lr", 3e-3, "--max-length", 24, "--vocab-size", 400, "--out", out, "--db", db,
        "--dtype", "float64", "--quiet")
    return db, out


def test_train_audit_extract_export_match_a_direct_computation(trained, dataset_csv, tmp_path):
    db, out = trained
    store = Store(db)
    train_run = store.run("tiny")
    assert train_run.status == "done" and train_run.kind == "train"
    assert sorted(p.name for p in out.iterdir()) == ["epoch-1", "epoch-2"]
    assert len(store.scores(train_run.run_id)) == 2 * 40

    gnq("audit", "--checkpoints", out, "--data", dataset_csv, "--db", db, "--name", "post", "--lam", 0.05,
        "--batch-size", 8, "--max-length", 24, "--seed", 3, "--dtype", "float64", "--quiet")
    run = store.run("post")
    points = store.points(run.run_id)
    assert list(points["label"]) == ["epoch-1", "epoch-2"] and set(points["status"]) == {"done"}

    # Post-hoc: the stored GNQ / loss / K_jj of one batch equal a direct GNQAuditor computation.
    model, tok = load_checkpoint(out / "epoch-2", dtype=torch.float64)
    data = pd.read_csv(dataset_csv)
    clusters = find_copies(data["text"].tolist())["cluster_id"].tolist()  # copies go to different batches
    part = batch_partition(len(data), 8, seed=3, clusters=clusters)[2]
    ids = encode_texts(tok, data["text"].tolist(), 24)
    batch = collate([ids[i] for i in part], part, pad_id(tok))
    with GNQAuditor(model, lam=0.05) as auditor:
        losses = per_example_lm_loss(model(input_ids=batch.input_ids,
                                           attention_mask=batch.attention_mask).logits, batch.labels)
        losses.sum().backward()
        res = auditor.compute()
    stored = store.scores(run.run_id, point=1).set_index("example_id").loc[part]
    assert rel_err(torch.tensor(stored["gnq"].to_numpy()), res.gnq) < 1e-9
    assert rel_err(torch.tensor(stored["self_influence"].to_numpy()), res.self_influence) < 1e-9
    assert rel_err(torch.tensor(stored["loss"].to_numpy()), losses.detach()) < 1e-12

    # In-run: the first step of epoch 2 starts from the epoch-1 weights and RNG state (dropout).
    model, tok = load_checkpoint(out / "epoch-1", dtype=torch.float64)
    state = torch.load(out / "epoch-1" / TRAINER_STATE, weights_only=True)
    part = batch_partition(len(data), 8, seed=0 + 1)[0]
    batch = collate([ids[i] for i in part], part, pad_id(tok))
    torch.set_rng_state(state["rng"])
    model.train()
    with GNQAuditor(model, lam=train_run.lam) as auditor:
        losses = per_example_lm_loss(model(input_ids=batch.input_ids,
                                           attention_mask=batch.attention_mask).logits, batch.labels)
        losses.sum().backward()
        res = auditor.compute()
    stored = store.scores(train_run.run_id, point=1).set_index("example_id").loc[part]
    assert (stored["step"] == 6).all()  # 5 steps per epoch, first of the second
    assert rel_err(torch.tensor(stored["gnq"].to_numpy()), res.gnq) < 1e-8

    threads = torch.get_num_threads()
    try:
        gnq("extract", "--db", db, "--run", "post", "--prefix-tokens", 4, "--threshold", 0.5, "--threads", 1,
            "--quiet")
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    attack = store.extractions(run.run_id)
    assert len(attack) == 40 and attack["match_fraction"].notna().sum() > 30
    assert set(attack["point"]) == {1}

    for fmt in ("csv", "jsonl", "parquet"):
        target = tmp_path / f"flagged.{fmt}"
        gnq("export", "--db", db, "--run", "post", "--top", 10, "--format", fmt, "--out", target, "--quiet")
        frame = {"csv": pd.read_csv, "jsonl": lambda p: pd.read_json(p, lines=True),
                 "parquet": pd.read_parquet}[fmt](target)
        assert len(frame) == 10 and list(frame["rank"]) == sorted(frame["rank"])
        for col in ("example_id", "text", "group", "gnq_total", "gnq_max", "gnq_last", "rank", "percentile",
                    "gnq_rank", "reason", "copies", "secret", "extraction_match", "reference_match",
                    "extracted", "loss_ratio"):
            assert col in frame.columns
    ranked = rank_texts(store.example_totals(run.run_id))  # the verdict order: leaked texts first
    top = pd.read_parquet(tmp_path / "flagged.parquet")
    first = top.iloc[0]
    assert first["rank"] == 1 and first["example_id"] == ranked.iloc[0]["example_id"]
    assert list(top["example_id"]) == list(ranked["example_id"][:10])
    assert first["text"] == data["text"][first["example_id"]]
    leaked = ranked["extracted"].fillna(False).astype(bool)
    assert not leaked.any() or leaked.iloc[: int(leaked.sum())].all()

    listing = json.loads(gnq("runs", "--db", db, "--json"))
    assert {r["name"] for r in listing} == {"tiny", "post"}
    post = next(r for r in listing if r["name"] == "post")
    assert post["lam"] == 0.05 and post["seed"] == 3 and post["dataset_hash"] and post["code_version"]
    assert "post" in gnq("runs", "--db", db)


def test_runs_at_80_columns_and_the_csv_guard_explained(trained, tmp_path):
    """A user's terminal: `gnq runs` at 80 columns shows whole headers and dates (columns left out are
    named), and `gnq export` says why a phone number "+351 …" reads "'+351 …" in the CSV."""
    db, out = trained
    data = tmp_path / "phones.csv"
    rows = [f"+351 912 345 {600 + i} is the number of desk {i}" for i in range(4)] + list(texts(8))
    pd.DataFrame({"text": rows}).to_csv(data, index=False)
    gnq("audit", "--checkpoints", out, "--data", data, "--db", db, "--name", "phones", "--batch-size", 4,
        "--max-length", 24, "--dtype", "float64", "--quiet")
    said = " ".join(gnq("export", "--db", db, "--run", "phones", "--out", tmp_path / "flagged.csv").split())
    with open(tmp_path / "flagged.csv", newline="", encoding="utf-8") as f:
        guarded = sum(cell.startswith("'+351") for row in csv.reader(f) for cell in row)
    assert guarded >= 4 and f"{guarded} cell(s) begin with '" in said, said
    assert "CSV injection" in said and "--exact-csv" in said
    assert "begin with '" not in gnq("export", "--db", db, "--run", "phones", "--out", tmp_path / "x.csv",
                                     "--exact-csv")
    assert "begin with '" not in gnq("export", "--db", db, "--run", "phones", "--out", tmp_path / "x.jsonl")

    root = Path(__file__).resolve().parents[2]
    for width in (80, 200):
        env = {**os.environ, "COLUMNS": str(width), "PYTHONPATH": str(root)}
        shown = subprocess.run([sys.executable, "-m", "gnq_core.cli", "runs", "--db", str(db)], env=env,
                               capture_output=True, text=True, check=True, timeout=120).stdout
        lines = shown.splitlines()
        assert max(len(line) for line in lines) <= width and "…" not in shown, shown
        assert all(h in shown for h in ("status", "points", "updated")) and "phones" in shown
        assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d ", shown), shown
        assert ("left out to fit 80 columns" in shown) == (width == 80), shown


def test_audit_rerun_skips_finished_checkpoints(trained, dataset_csv):
    db, out = trained
    args = ["audit", "--checkpoints", out, "--data", dataset_csv, "--db", db, "--name", "again",
            "--batch-size", 8, "--max-length", 24, "--dtype", "float64", "--quiet"]
    gnq(*args)
    before = Store(db).scores(Store(db).run("again").run_id)
    gnq(*args[:-1])  # not quiet: says what it skipped
    after = Store(db).scores(Store(db).run("again").run_id)
    pd.testing.assert_frame_equal(before, after)
    output = runner.invoke(app, [str(a) for a in args[:-1]]).output
    assert "already audited" in output
    # The same name with other settings is refused rather than mixed.
    assert "different" in fails(*args[:-1], "--lam", 0.5)


@pytest.mark.parametrize("fmt", ["txt", "jsonl", "parquet"])
def test_audit_accepts_each_input_format(trained, tmp_path, fmt):
    db, out = trained
    rows = list(texts(12))
    path = tmp_path / f"texts.{fmt}"
    if fmt == "txt":
        path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    elif fmt == "jsonl":
        path.write_text("\n".join(json.dumps({"body": r, "group": "g"}) for r in rows), encoding="utf-8")
    else:
        pd.DataFrame({"text": rows}).to_parquet(path)
    extra = ["--text-column", "body"] if fmt == "jsonl" else []
    gnq("audit", "--checkpoints", out / "epoch-2", "--data", path, "--db", tmp_path / "f.duckdb",
        "--batch-size", 4, "--max-length", 16, "--quiet", *extra)
    store = Store(tmp_path / "f.duckdb")
    run = store.run("epoch-2")
    totals = store.example_totals(run.run_id)
    assert len(totals) == 12 and totals["gnq_total"].notna().all() and (totals["gnq_total"] > 0).all()
    assert set(store.examples(run.run_id)["text"]) == set(rows)


def test_user_errors_are_one_line(trained, tmp_path):
    db, out = trained
    assert "missing.csv" in fails("audit", "--checkpoints", out, "--data", tmp_path / "missing.csv",
                                  "--db", db)
    (tmp_path / "empty").mkdir()
    texts_file = tmp_path / "t.txt"
    texts_file.write_text("hello world\n")
    assert "no checkpoint" in fails("audit", "--checkpoints", tmp_path / "empty", "--data", texts_file,
                                    "--db", db)
    assert "no run 'nope'" in fails("export", "--db", db, "--run", "nope", "--format", "csv",
                                    "--out", tmp_path / "x.csv")
    assert "--format" in fails("export", "--db", db, "--run", "tiny", "--format", "xls",
                               "--out", tmp_path / "x.xls")
    assert "exactly one of" in fails("train", "--data", texts_file, "--out", tmp_path / "o", "--db", db)
    assert not (tmp_path / "x.csv").exists()
