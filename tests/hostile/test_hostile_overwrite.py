"""Nothing overwritten, nothing swapped: no command's output replaces a file the
tool depends on (another run's checkpoints, the store, a dataset), and a recorded checkpoint is
verified against its stored hash before it is reused."""

from __future__ import annotations

import shutil

import pytest
from hostile_helpers import gnq, make_series, write_texts_csv
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.sources.checkpoints.files import checkpoint_hash

pytestmark = pytest.mark.slow

TRAIN = ["--from-scratch", "--epochs", 1, "--batch-size", 4, "--max-length", 12, "--vocab-size", 300,
         "--quiet"]


def fails(*args: object) -> str:
    """`gnq ARGS` in this process; must fail with exit code 1 and one line."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("owner")
    data = write_texts_csv(root / "texts.csv", 12)
    gnq("train", "--data", data, "--out", root / "a", "--db", root / "gnq.duckdb", "--name", "a", *TRAIN)
    return root, data


def test_train_out_onto_another_runs_checkpoints_is_refused(trained):
    root, data = trained
    before = checkpoint_hash(root / "a" / "epoch-1")
    for out in (root / "a", root / "a" / "epoch-1", root / "a" / "inner"):
        line = fails("train", "--data", data, "--out", out, "--db", root / "gnq.duckdb", "--name", "b",
                     *TRAIN)
        assert "would overwrite run 'a'" in line
    assert checkpoint_hash(root / "a" / "epoch-1") == before
    assert "'b'" not in gnq("runs", "--db", root / "gnq.duckdb")  # refused before any run was made
    # another store does not know the folder: still not replaced
    line = fails("train", "--data", data, "--out", root / "a", "--db", root / "other.duckdb", "--name", "c",
                 *TRAIN)
    assert "already exists" in line and checkpoint_hash(root / "a" / "epoch-1") == before


def test_train_out_onto_its_own_inputs_is_refused(tmp_path):
    folder = tmp_path / "d" / "epoch-1"
    folder.mkdir(parents=True)
    data = write_texts_csv(folder / "texts.csv", 12)
    line = fails("train", "--data", data, "--out", tmp_path / "d", "--db", tmp_path / "gnq.duckdb", *TRAIN)
    assert "an input of this command" in line and data.is_file()


@pytest.mark.parametrize("target", ["store", "wal", "dataset", "checkpoint"])
def test_exports_never_replace_what_the_store_depends_on(trained, target):
    root, data = trained
    db = root / "gnq.duckdb"
    out = {"store": db, "wal": root / "gnq.duckdb.wal", "dataset": data,
           "checkpoint": root / "a" / "epoch-1" / "model.csv"}[target]
    size = db.stat().st_size
    assert "would overwrite" in fails("export", "--run", "a", "--out", out, "--format", "csv", "--db", db)
    assert "would overwrite" in fails("report", "--run", "a", "--out", out, "--db", db)
    assert db.stat().st_size == size and data.is_file()


def test_extract_refuses_a_swapped_checkpoint(tmp_path):
    series = make_series(tmp_path / "series", 2, max_length=16)
    data = write_texts_csv(tmp_path / "texts.csv", 8)
    db = tmp_path / "gnq.duckdb"
    gnq("audit", "--checkpoints", series, "--data", data, "--db", db, "--name", "s", "--batch-size", 4,
        "--max-length", 16, "--quiet")
    shutil.rmtree(series / "epoch-2")
    shutil.copytree(series / "epoch-1", series / "epoch-2")  # same architecture, other weights
    line = fails("extract", "--run", "s", "--db", db, "--prefix-tokens", 4, "--suffix-tokens", 4, "--quiet")
    assert "changed since it was recorded" in line and "epoch-2" in line
