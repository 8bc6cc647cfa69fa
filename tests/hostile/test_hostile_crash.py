"""Interrupted jobs: `gnq train`, `gnq audit` and `gnq extract` are killed with SIGKILL (no
handler runs, nothing is flushed) at chosen moments, then rerun; the result must equal an
uninterrupted run's: the same rows, none missing, none twice, and the same final weights.  The
killed jobs are processes forked from a zygote that has the imports done (zygote.py)."""

from __future__ import annotations

import os
import shutil

import pandas as pd
import pytest
from hostile_helpers import as_a_fresh_process, gnq, kill_when, run_row, write_texts_csv

from gnq_core.results.store import Store
from gnq_core.sources.checkpoints.files import checkpoint_hash

pytestmark = pytest.mark.slow

EPOCHS = 2
N = 24  # texts
TRAIN = ["--from-scratch", "--epochs", EPOCHS, "--batch-size", 6, "--max-length", 16, "--vocab-size", 300,
         "--lr", 3e-3, "--dtype", "float64", "--quiet"]


def train_args(data, out, db):
    return ["train", "--data", data, "--out", out, "--db", db, "--name", "t", *TRAIN]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_texts_csv(tmp_path_factory.mktemp("data") / "texts.csv", N)


@pytest.fixture(scope="module")
def clean_training(tmp_path_factory, data, zygote):  # noqa: ARG001 - the zygote imports meanwhile
    """The uninterrupted run every interrupted one is compared with."""
    root = tmp_path_factory.mktemp("clean")
    with as_a_fresh_process():
        gnq(*train_args(data, root / "out", root / "gnq.duckdb"))
    return root / "gnq.duckdb", root / "out"


def rows(db, name: str, table: str) -> pd.DataFrame:
    store = Store(db)
    run_id = store.run(name).run_id
    frame = getattr(store, table)(run_id)
    drop = [c for c in ("run_id", "seconds", "created_at", "code_version") if c in frame.columns]
    return frame.drop(columns=drop).reset_index(drop=True)


def test_train_killed_twice_then_rerun_equals_an_uninterrupted_run(tmp_path, data, clean_training, zygote):
    db, out = tmp_path / "gnq.duckdb", tmp_path / "out"
    args = train_args(data, out, db)

    # 1. Killed during the first epoch: the run exists, no epoch is finished.
    proc = zygote.start(*args)
    kill_when(proc, lambda: (r := run_row(db, "t")) is not None and r["progress_total"] > 0,
              "the first epoch started", paused=True, store=db)
    assert run_row(db, "t")["points_done"] == 0
    # 2. Rerun, killed again during the second epoch (after epoch 1 was committed).
    proc = zygote.start(*args)
    kill_when(proc, lambda: run_row(db, "t")["points_done"] >= 1, "the first epoch was committed",
              paused=True, store=db)
    assert run_row(db, "t")["points_done"] == 1 and run_row(db, "t")["status"] == "running"
    # 3. Rerun to the end.
    with as_a_fresh_process():
        gnq(*args)

    clean_db, clean_out = clean_training
    assert Store(db).run("t").status == "done"
    for table in ("scores", "batches", "points"):
        got, want = rows(db, "t", table), rows(clean_db, "t", table)
        if table == "points":  # finished_at and the folders differ by construction
            got, want = got[["point", "label", "status"]], want[["point", "label", "status"]]
        pd.testing.assert_frame_equal(got, want, check_exact=True, obj=table)
    assert len(rows(db, "t", "scores")) == EPOCHS * N
    assert not rows(db, "t", "scores").duplicated(["point", "example_id"]).any()
    # The same weights, bit for bit, and no half-written checkpoint left behind.
    for epoch in range(1, EPOCHS + 1):
        assert checkpoint_hash(out / f"epoch-{epoch}") == checkpoint_hash(clean_out / f"epoch-{epoch}")
    assert sorted(p.name for p in out.iterdir()) == [f"epoch-{e}" for e in range(1, EPOCHS + 1)]


def test_extract_killed_mid_attack_then_rerun_equals_an_uninterrupted_attack(tmp_path, clean_training,
                                                                            zygote):
    source, _ = clean_training
    killed, clean = tmp_path / "killed.duckdb", tmp_path / "clean.duckdb"
    shutil.copy(source, clean)
    args = ["extract", "--run", "t", "--prefix-tokens", 3, "--threshold", 0.5, "--batch-size", 2, "--quiet"]
    # The store can be read only between the attack's commits, and a quiet machine attacks all
    # 24 texts in moments: the attack is stopped (SIGSTOP) for each look, so it cannot go on
    # between the look and the kill; if the first readable moment still came after the last
    # batch, start over from the copy (a race of the test, not of the code).
    for _attempt in range(4):
        shutil.copy(source, killed)
        proc = zygote.start(*args, "--db", killed)
        kill_when(proc, lambda: run_row(killed, "t")["extraction_rows"] >= 4, "some texts were attacked",
                  paused=True, store=killed)
        partial = int(run_row(killed, "t")["extraction_rows"])
        if partial < N:
            break
    assert 4 <= partial < N, "the kill should land mid-attack"
    with as_a_fresh_process():
        resumed = gnq(*args[:-1], "--db", killed)
        gnq(*args, "--db", clean)
    assert "resuming the attack" in resumed
    got, want = rows(killed, "t", "extractions"), rows(clean, "t", "extractions")
    assert len(got) == N and not got.duplicated(["point", "example_id", "prefix_tokens"]).any()
    pd.testing.assert_frame_equal(got.sort_values("example_id").reset_index(drop=True),
                                  want.sort_values("example_id").reset_index(drop=True), obj="extractions")
    # Rerunning a finished attack replaces it (never duplicates).
    with as_a_fresh_process():
        gnq(*args[:-3], "--batch-size", N, "--db", killed, "--quiet")
    assert len(rows(killed, "t", "extractions")) == N


def test_audit_killed_mid_series_then_rerun_equals_an_uninterrupted_run(tmp_path, data, clean_training,
                                                                        zygote):
    _, out = clean_training
    series = tmp_path / "series"
    series.mkdir()
    for k in range(1, 4):  # three checkpoints (two distinct models)
        os.symlink(out / f"epoch-{1 + k % EPOCHS}", series / f"step-{k}")
    killed, clean = tmp_path / "killed.duckdb", tmp_path / "clean.duckdb"
    args = ["audit", "--checkpoints", series, "--data", data, "--name", "a", "--batch-size", 8,
            "--max-length", 16, "--dtype", "float64", "--quiet"]
    proc = zygote.start(*args, "--db", killed)
    kill_when(proc, lambda: run_row(killed, "a")["points_done"] >= 1, "the first checkpoint was committed",
              paused=True, store=killed)
    assert 1 <= run_row(killed, "a")["points_done"] < 3, "the kill should land mid-audit"
    with as_a_fresh_process():
        gnq(*args, "--db", killed)
        gnq(*args, "--db", clean)
    for table in ("scores", "batches"):
        pd.testing.assert_frame_equal(rows(killed, "a", table), rows(clean, "a", table), check_exact=True,
                                      obj=table)
    assert len(rows(killed, "a", "scores")) == 3 * N
