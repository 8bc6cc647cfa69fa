"""A text of one token has no next token to predict: no loss, no gradient, so no GNQ.  It is stored
with NULL GNQ, loss and K_jj (not 0, which reads as "fits perfectly, encodes nothing"), counted in
one line by `gnq audit` and `gnq train`, never attacked by `gnq extract`."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from hostile_helpers import app_page, gnq, make_series
from lm_fixtures import texts

from gnq_core.results.store import Store
from gnq_core.sources.checkpoints.tokenizer import load_tokenizer

pytestmark = pytest.mark.slow


def _dataset(path, tokenizer):
    rows = list(texts(12))
    one = next(w for w in ("a", "the", "x", "1") if len(tokenizer.encode(w, add_special_tokens=False)) == 1)
    rows.insert(3, one)
    pd.DataFrame({"text": rows}).to_csv(path, index=False)
    return path, 3


def _check(db, output: str, short: int) -> None:
    assert "1 text(s) have fewer than 2 tokens" in output
    store = Store(db)
    run = store.runs().iloc[-1]
    scores = store.scores(int(run["run_id"]))
    mine, others = scores[scores.example_id == short], scores[scores.example_id != short]
    assert len(mine) and mine[["gnq", "loss", "self_influence"]].isna().all().all()
    assert (others["loss"] > 0).all() and others["self_influence"].map(math.isfinite).all()
    # a text alone in its GNQ batch (13 texts in batches of 4: the last one) has no companions,
    # so no GNQ, and the command says so; every other text has a finite GNQ
    alone = others["gnq"].isna()
    assert others.loc[~alone, "gnq"].map(math.isfinite).all()
    assert alone.sum() == 1 and "1 text(s) were alone in their GNQ batch" in output


def test_audit_stores_a_one_token_text_without_scores(tmp_path, monkeypatch):
    series = make_series(tmp_path / "ckpts", 1)
    data, short = _dataset(tmp_path / "texts.csv", load_tokenizer(series / "epoch-1"))
    db = tmp_path / "gnq.duckdb"
    _check(db, gnq("audit", "--checkpoints", series, "--data", data, "--db", db, "--max-length", 32,
                   "--batch-size", 4, "--name", "short", "-q"), short)
    monkeypatch.setenv("GNQ_DB", str(db))
    for page in ("drilldown", "dataset_map", "flagged", "groups"):  # the dashboard shows it as missing
        at = app_page(page, run_name="short", example_id=short)
        assert not at.exception, (page, [e.message for e in at.exception])


def test_train_stores_a_one_token_text_without_scores(tmp_path):
    series = make_series(tmp_path / "ckpts", 1)
    data, short = _dataset(tmp_path / "texts.csv", load_tokenizer(series / "epoch-1"))
    db = tmp_path / "gnq.duckdb"
    _check(db, gnq("train", "--init", series / "epoch-1", "--data", data, "--db", db,
                   "--out", tmp_path / "run", "--epochs", 1, "--max-length", 32, "--batch-size", 4, "-q"),
           short)
