"""The verdict acted on and verified, through the real ``gnq`` commands: a tiny GPT-2 trained on a
file with planted secret values at 8 copies each writes them out; ``gnq remediate`` writes the
cleaned file and its manifest; a model retrained on that file, its checkpoints audited over the
original data, writes none of them, and ``gnq compare`` says so value by value."""

from __future__ import annotations

import json
import random
import shutil

import pandas as pd
import pytest
import torch
from cli_helpers import gnq
from scenario_data import card, scenario

from gnq_core.analysis.value_compare import FIXED, value_changes
from gnq_core.results.store import Store

COMMON = ["--batch-size", 8, "--max-length", 40, "--threads", 1, "--quiet"]
TRAIN = ["--from-scratch", "--preset", "tiny", "--epochs", 16, "--lr", 5e-3, "--vocab-size", 400]


def planted_file(tmp_path):
    """``train.csv``: 24 ordinary texts and the three planted values' texts at 8 copies, shuffled."""
    rng = random.Random(5)
    filler = scenario(seed=1, n_filler=24, n_secrets=0, n_records=0, predictable_copies=0)["text"].tolist()
    rows = [(t, "filler") for t in filler] + [(p, "planted") for p in _planted(rng) for _ in range(8)]
    rng.shuffle(rows)
    data = tmp_path / "train.csv"
    pd.DataFrame(rows, columns=["text", "group"]).to_csv(data, index=False)
    return data


def _planted(rng: random.Random) -> list[str]:
    return [f"Charge Tom Okafor's card {card(rng)} today.",
            f"Call Lena Novak on the private line +44 20 {rng.randrange(1000, 9999)} "
            f"{rng.randrange(1000, 9999)} now.",
            f"Note for Anna Berg: the door PIN is {rng.randrange(1000, 9999)}, keep it."]


@pytest.mark.slow
def test_planted_values_leak_the_cleaned_file_fixes_them_and_compare_says_so_per_value(tmp_path):
    data = planted_file(tmp_path)
    db = tmp_path / "gnq.duckdb"
    previous = torch.get_default_dtype()  # `gnq train` draws its weights in torch's default dtype
    torch.set_default_dtype(torch.float32)
    try:
        gnq("train", "--data", data, *TRAIN, "--out", tmp_path / "run1", "--name", "first", "--db", db,
            *COMMON)
        gnq("extract", "--run", "first", "--db", db, "--threads", 1, "--quiet")
        store = Store(db)
        before = store.value_outcomes(store.run("first").run_id)
        leaked = before[before["leaked"]]
        assert len(leaked) >= 2, "8 copies should make the model write at least two planted values whole"
        said = gnq("remediate", "--run", "first", "--out", tmp_path / "clean.csv", "--db", db)
        assert all(v not in said for v in before["value"])  # counts only: no value in the output
        clean = pd.read_csv(tmp_path / "clean.csv")
        manifest = json.loads((tmp_path / "clean.csv.manifest.json").read_text())
        for value in leaked["value"]:
            assert not clean["text"].str.contains(value, regex=False).any()
            assert value not in json.dumps(manifest)
        replaced = {c["kind"] for c in manifest["changes"] if c["action"] == "replace"}
        assert replaced == set(leaked["kind"])
        assert sum(c["action"] == "drop" for c in manifest["changes"]) == 7 * len(leaked)  # one copy kept
        gnq("train", "--data", tmp_path / "clean.csv", *TRAIN, "--out", tmp_path / "run2", "--name", "second",
            "--db", db, *COMMON)
        picked = tmp_path / "picked"  # the retrained model's first and last checkpoints: the original data
        for label in ("epoch-1", "epoch-16"):
            shutil.copytree(tmp_path / "run2" / label, picked / label)
        gnq("audit", "--checkpoints", picked, "--data", data, "--name", "after", "--db", db, *COMMON)
        gnq("extract", "--run", "after", "--db", db, "--threads", 1, "--quiet")
    finally:
        torch.set_default_dtype(previous)
    out = gnq("compare", "--run", "first", "--with", "after", "--json", tmp_path / "cmp.json", "--db", db)
    after = store.value_outcomes(store.run("after").run_id)
    changes = value_changes(before, after).set_index("value")
    for value in leaked["value"]:  # retrained on the cleaned file: no leaked value comes out again
        assert changes.loc[value, "status_before"] == "leaked"
        assert changes.loc[value, "status_after"] == "not leaked"
        assert not changes.loc[value, "still_reproduced"]
        assert changes.loc[value, "verdict"] == FIXED
    assert f"{len(leaked)} of {len(before)} value(s) fixed" in out and "still reproduced" not in out
    table = json.loads((tmp_path / "cmp.json").read_text())["values"]
    assert len(table) == len(before) and all("value" not in r for r in table)
