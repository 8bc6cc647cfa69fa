"""Disk full, read-only folders, dead processes: every I/O failure of gnq audit /
train / extract and of store writes is one line naming the file and the cause, exit code 1; a
run whose process died shows as 'interrupted', never 'running' for ever; a rerun resumes."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from hostile_helpers import app_page, gnq, make_series, write_texts_csv
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.results.liveness import run_is_alive
from gnq_core.results.records import RunSpec

# Runs `gnq` with a store whose disk "fills up" at the first write of scores: from then on every
from gnq_core.results.store import Store
from gnq_core.results.store_schema import StoreError

# statement that writes fails as DuckDB fails on a full disk (so marking the run failed fails too).
FULL_DISK_GNQ = textwrap.dedent("""
    import sys, duckdb
    from gnq_core.results import store

    FULL = False
    class FullDisk:
        def __init__(self, con): self._con = con
        def __getattr__(self, name): return getattr(self._con, name)
        def execute(self, sql, *args):
            global FULL
            FULL = FULL or sql.lstrip().startswith("INSERT INTO scores")
            if FULL and not sql.lstrip().upper().startswith(("SELECT", "ROLLBACK", "WITH")):
                raise duckdb.IOException('IO Error: Could not write file "' + sys.argv[1] +
                                         '.wal": No space left on device')
            return self._con.execute(sql, *args)

    real_open = store.Store._open
    store.Store._open = lambda self, read_only: FullDisk(real_open(self, read_only))
    from gnq_core.cli import app
    sys.argv = ["gnq", *sys.argv[2:]]
    app()
""")


@pytest.fixture(scope="module")
def series(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("io")
    return make_series(folder / "ckpt", 1), write_texts_csv(folder / "texts.csv", 16)


@pytest.mark.slow
def test_store_full_disk_during_audit_is_one_line_and_the_run_shows_interrupted(series, tmp_path):
    checkpoints, data = series
    db = tmp_path / "full.duckdb"
    args = ["audit", "--checkpoints", checkpoints, "--data", data, "--db", db, "--name", "a", "-q",
            "--max-length", 16, "--threads", 1]
    proc = subprocess.run([sys.executable, "-c", FULL_DISK_GNQ, str(db), *map(str, args)],
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and str(db) in lines[0] and "No space left on device" in lines[0], proc.stderr
    store = Store(db)
    run = store.run("a")
    assert run.status == "interrupted"  # the process is gone; 'running' would never end
    assert store.runs().iloc[0]["status"] == "interrupted"
    # Space freed: the same command resumes and finishes (in this process: the store is what it resumes from).
    gnq(*args)
    assert store.run("a").status == "done" and len(store.scores(run.run_id)) == 16


def test_a_full_disk_when_saving_a_checkpoint_names_it(monkeypatch, tmp_path):
    """safetensors reports ENOSPC as its own error type: it reached the user as a traceback."""
    class SafetensorError(Exception):
        pass

    def save_pretrained(self, path, **kwargs):  # noqa: ARG001
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr("transformers.PreTrainedModel.save_pretrained", save_pretrained)
    data = write_texts_csv(tmp_path / "t.csv", 20)
    result = CliRunner().invoke(app, ["train", "--data", str(data), "--out", str(tmp_path / "run"),
                                      "--from-scratch", "--epochs", "1", "--max-length", "16", "-q",
                                      "--db", str(tmp_path / "s.duckdb")])
    assert result.exit_code == 1, result.output
    assert f"{tmp_path / 'run' / 'epoch-1'}: No space left on device" in result.output
    assert not (tmp_path / "run" / "epoch-1").exists()
    assert Store(tmp_path / "s.duckdb").runs().iloc[0]["status"] == "failed"


def test_os_errors_become_one_line_naming_the_file(monkeypatch, tmp_path):
    """Any OSError (not only FileNotFoundError/PermissionError) reaching the CLI: file and cause."""
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path / "texts.csv"))

    monkeypatch.setattr("gnq_core.sources.datasets.load_texts", read_only)
    result = CliRunner().invoke(app, ["audit", "--checkpoints", str(tmp_path), "--data",
                                      str(tmp_path / "texts.csv"), "--db", str(tmp_path / "s.duckdb")])
    assert result.exit_code == 1
    assert result.output.strip() == f"error: {tmp_path / 'texts.csv'}: Read-only file system"


def test_store_in_a_folder_that_cannot_be_created(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="cannot create its folder"):
        Store(tmp_path / "file" / "sub" / "s.duckdb").set_progress(1, 0, 0)


def test_liveness_of_a_running_run(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    now = datetime.now()
    here = socket.gethostname()
    assert run_is_alive(os.getpid(), here, now)
    assert not run_is_alive(dead.pid, here, now)
    assert not run_is_alive(dead.pid, None, None)  # a run from before hosts were recorded
    assert run_is_alive(dead.pid, "other-host", now - timedelta(minutes=5))  # its pid means nothing here
    assert not run_is_alive(dead.pid, "other-host", now - timedelta(hours=1), now=now)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        for _ in range(200):  # exited but not reaped: still has a pid
            if Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.05)
        assert not run_is_alive(zombie.pid, here, now)
    finally:
        zombie.wait()


def test_dashboard_shows_a_dead_run_as_interrupted(tmp_path, monkeypatch):
    db = tmp_path / "s.duckdb"
    store = Store(db)
    store.create_run(RunSpec(name="gone", kind="audit", lam=0.01, batch_size=2, seed=0, max_length=8,
                             model_path="m", dataset_path="d", dataset_hash="h", n_examples=0,
                             code_version="v", device="cpu", dtype="float32"))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with store.transaction() as con:  # as if another process had started it and died
        con.execute("UPDATE runs SET pid = ?", [dead.pid])
    monkeypatch.setenv("GNQ_DB", str(db))
    at = app_page("runs")
    assert not at.exception
    shown = " ".join(str(df.value.to_dict()) for df in at.dataframe)
    assert "interrupted" in shown and "running" not in shown
