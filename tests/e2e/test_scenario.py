"""The scenario a privacy auditor lives through, end to end through the real `gnq` command:
a base model learns public text; it is fine-tuned on data that also holds planted unique secrets
and repeated customer records; the fine-tune's checkpoints are audited post hoc, attacked with
the calibrated rule (reference = the base model) and exported.  Checks that the default ranking
puts what leaked at the top, that copies are counted, and that a continuation the reference
model also writes is not called a leak.
"""

from __future__ import annotations

import pandas as pd
import pytest
from cli_helpers import gnq
from scenario_data import scenario
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.results.store import Store

pytestmark = pytest.mark.slow
runner = CliRunner()
COMMON = ["--batch-size", 16, "--max-length", 48, "--threads", 1, "--quiet"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("scenario")
    db = root / "gnq.duckdb"
    data = scenario(seed=0)
    data.to_csv(root / "all.csv", index=False)
    public = data[data["group"].isin(["filler", "predictable"])].iloc[:110]
    public.to_csv(root / "public.csv", index=False)
    gnq("train", "--data", root / "public.csv", "--from-scratch", "--preset", "tiny", "--epochs", 10,
        "--lr", 3e-3, "--vocab-size", 512, "--out", root / "base", "--db", db, *COMMON)
    gnq("train", "--data", root / "all.csv", "--init", root / "base" / "epoch-10", "--epochs", 12,
        "--lr", 5e-3, "--out", root / "ft", "--db", db, *COMMON)
    gnq("audit", "--checkpoints", root / "ft", "--data", root / "all.csv", "--name", "ft-audit", "--db", db,
        *COMMON)
    gnq("extract", "--run", "ft-audit", "--reference", root / "base" / "epoch-10", "--db", db,
        "--threads", 1, "--quiet")
    gnq("export", "--run", "ft-audit", "--format", "csv", "--out", root / "flagged.csv", "--db", db,
        "--quiet")
    exported = pd.read_csv(root / "flagged.csv")
    exported["planted_group"] = data["group"].to_numpy()[exported["example_id"]]
    return root, db, data, exported


def test_leaked_planted_texts_rank_at_the_top(run):
    _, _, data, out = run
    n = len(out)
    assert sorted(out["rank"]) == list(range(1, n + 1)) and out["reason"].str.len().min() > 0
    extracted = out["extracted"].fillna(False).astype(bool)  # the text attack's 8-token window
    planted = out["planted_group"].isin(["unique-secret", "repeated-record"])
    assert (planted & extracted).sum() >= 1, "the fine-tune should write some planted text's window"
    # leaked by the verdict's rule: for a text with a secret-like value, the secret attack decides
    # (its window coming out without the secret is no leak); otherwise the text attack
    # (its window coming out without the secret is "text reproduced", never "leaked")
    has_value = out["secret_reproduced"].notna()
    has_secret = out["secret"].notna()
    expected = out["secret_reproduced"].where(has_value, extracted & ~has_secret).astype(bool)
    assert ((out["status"] == "leaked") == expected).all()
    window_only = extracted & has_value & ~out["secret_reproduced"].astype("boolean").fillna(False)
    assert out.loc[window_only, "reason"].str.contains("do come out word for word").all()
    assert out.loc[window_only, "status"].isin(["partly leaked", "text reproduced"]).all()
    # tiers: leaked, partly leaked, text reproduced, secret-like content, then the rest
    tier = out["status"].map({"leaked": 4, "partly leaked": 3, "text reproduced": 2, "secret": 1,
                              "public": -1}).fillna(0)
    assert list(tier) == sorted(tier, reverse=True)
    base_rate = extracted.mean()
    top = out["percentile"] > 80.0  # the top 20% of the default ranking
    assert extracted[top].mean() >= 2 * base_rate


def test_every_copy_carries_its_count_and_secrets_are_labelled(run):
    _, _, _, out = run
    expected = out["planted_group"].map({"repeated-record": 4, "predictable": 2}).fillna(1)
    assert (out["copies"] == expected).all()
    assert out.loc[out["planted_group"] == "repeated-record", "cluster_id"].nunique() == 6
    has_secret = out["secret"].notna()
    assert has_secret[out["planted_group"].isin(["unique-secret", "repeated-record"])].all()
    assert not has_secret[out["planted_group"] == "filler"].any()
    # the post-hoc partition keeps copies apart, so no GNQ value is spoiled by a copy
    assert (out["gnq_with_copy"] == 0).all()


def test_in_run_training_marks_gnq_measured_with_a_copy_in_the_batch(run):
    _, db, _, _ = run
    store = Store(db)
    ft = store.run("ft")
    shared, steps = store.steps_with_copies(ft.run_id)
    assert 0 < shared < steps
    totals = store.example_totals(ft.run_id)
    assert (totals.loc[totals["copies"] == 1, "gnq_with_copy"] == 0).all()
    assert (totals.loc[totals["copies"] > 1, "gnq_with_copy"] > 0).any()


def test_what_the_reference_also_writes_is_not_extracted(run):
    _, db, _, out = run
    both = out[(out["extraction_match"] == 1.0) & (out["reference_match"] == 1.0)]
    assert len(both) >= 1  # the public chant and lines the base model learned
    assert not both["extracted"].fillna(False).astype(bool).any()
    attack = Store(db).run("ft-audit").settings["attack"]
    assert attack["reference"].endswith("epoch-10") and attack["both_reproduced"] == len(both)
    assert "reference model" in attack["rule"] and attack["suffix_tokens"] == 8
    scores = out[out["extraction_match"].notna()]
    assert scores[["loss_ratio", "zlib_ratio", "min_k_prob"]].notna().all().all()


def test_a_reference_with_another_tokenizer_is_refused_before_writing(run, tmp_path):
    root, db, data, _ = run
    other = tmp_path / "other.csv"
    pd.DataFrame({"text": [f"completely different words number {i} here" for i in range(16)]}).to_csv(
        other, index=False)
    gnq("train", "--data", other, "--from-scratch", "--preset", "tiny", "--epochs", 1, "--vocab-size", 300,
        "--out", tmp_path / "foreign", "--db", tmp_path / "x.duckdb", *COMMON)
    store = Store(db)
    run_id = store.run("ft-audit").run_id
    before = (store.extractions(run_id), store.metrics(run_id), store.run(run_id).settings)
    foreign = tmp_path / "foreign" / "epoch-1"
    result = runner.invoke(app, ["extract", "--run", "ft-audit", "--reference", str(foreign), "--db", str(db),
                                 "--quiet"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "tokenizer differs" in result.output and len(result.output.strip().splitlines()) == 1
    after = (store.extractions(run_id), store.metrics(run_id), store.run(run_id).settings)
    pd.testing.assert_frame_equal(before[0], after[0])
    pd.testing.assert_frame_equal(before[1], after[1])
    assert before[2] == after[2]
