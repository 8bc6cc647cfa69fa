"""Concurrent use of one store: the dashboard reads while a real `gnq audit` process writes; two
jobs write at once; a writer that holds the store too long gives a one-line message, never
DuckDB's lock traceback."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time

import pandas as pd
import pytest
from hostile_helpers import app_page, gnq_cmd, make_series, write_texts_csv
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.jobs.jobs import list_jobs, start_job
from gnq_core.pipelines.settings import AuditJob, AuditSettings
from gnq_core.results.store import Store

pytestmark = pytest.mark.slow
PAGES = ["runs", "new_audit", "trajectories", "extraction", "groups", "drilldown", "flagged"]
BUSY = "is busy (another gnq job is writing); waiting..."


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    return make_series(root / "series", 3), write_texts_csv(root / "texts.csv", 30)


def audit_args(inputs, name: str, batch_size: int = 3, checkpoints: str = "") -> list[str]:
    series, data = inputs
    return ["audit", "--checkpoints", str(series / checkpoints), "--data", str(data), "--name", name,
            "--batch-size", str(batch_size), "--max-length", "16", "--dtype", "float64"]


def test_dashboard_stays_usable_and_shows_live_progress_while_an_audit_writes(tmp_path, monkeypatch, inputs):
    db = tmp_path / "gnq.duckdb"
    monkeypatch.setenv("GNQ_DB", str(db))
    assert not app_page("runs").exception  # warm up (imports) before the job starts
    series, data = inputs
    settings = AuditSettings(batch_size=3, max_length=16, dtype="float64")
    job = start_job("live", db, [AuditJob(checkpoints=str(series), data=str(data), name="live",
                                          settings=settings)])
    progress: list[str] = []
    renders = 0
    deadline = time.monotonic() + 300
    live = re.compile(r"\d+/30 texts · stage \d of 3 · ")
    # The runs page (with the live job panel), then each other page in turn, all while the job
    # writes, until every page was drawn and live progress was seen (then just wait for the job).
    while list_jobs(db)[0].status in ("queued", "running"):
        assert time.monotonic() < deadline, "the audit job did not finish"
        if renders >= len(PAGES) - 1 and any(live.search(t) for t in progress):
            time.sleep(0.2)
            continue
        for name in ("runs", PAGES[1 + renders % (len(PAGES) - 1)]):
            at = app_page(name)
            assert not at.exception, (name, [e.message for e in at.exception])
            progress += [p.text for p in at.get("progress")]
        renders += 1
    job = list_jobs(db)[0]
    assert job.status == "done", job.log_tail()
    assert any(live.search(t) for t in progress), f"no live progress seen in {renders} renders: {progress}"
    at = app_page("runs")
    runs = at.dataframe[0].value
    assert list(runs["status"]) == ["done"] and list(runs["points_done"]) == [3]
    assert len(Store(db).scores(Store(db).run("live").run_id)) == 3 * 30


def test_two_jobs_on_one_store_both_succeed(tmp_path, inputs, zygote):
    db = tmp_path / "gnq.duckdb"
    # Two processes that start at once (forked from the zygote: no imports to stagger them).
    procs = [zygote.start(*audit_args(inputs, name, 10, "epoch-1"), "--db", db, "--quiet")
             for name in ("one", "two")]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        # The only thing a job may say about the other is that it waits for it.
        assert all(BUSY in line for line in err.splitlines() if line.strip()), err
    store = Store(db)
    one, two = (store.scores(store.run(n).run_id).drop(columns="run_id") for n in ("one", "two"))
    assert len(one) == 30
    pd.testing.assert_frame_equal(one, two)


def hold_store(db) -> subprocess.Popen:
    """Another process with the store open for writing (as a job is during a commit), until it
    reads a line on stdin."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import duckdb, sys
        con = duckdb.connect({str(db)!r}); print("locked", flush=True); sys.stdin.readline()
        con.close()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def release(holder: subprocess.Popen) -> None:
    holder.stdin.write("\n")
    holder.stdin.close()
    holder.wait(timeout=60)


def test_a_busy_store_makes_the_second_job_wait_with_a_message(tmp_path, monkeypatch):
    db = tmp_path / "gnq.duckdb"
    Store(db).set_progress(0, 0, 0)  # creates the store file
    holder = hold_store(db)
    proc = subprocess.Popen(gnq_cmd("runs", "--db", db), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    first = proc.stderr.readline()  # blocks until the command says it is waiting
    release(holder)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert first.strip() == f"{db} {BUSY}" and not err.strip()
    assert "no runs yet" in " ".join(out.split())

    # Held for longer than the caller will wait: one line and exit 1 (CLI), an error box (app).
    holder = hold_store(db)
    try:
        monkeypatch.setenv("GNQ_BUSY_TIMEOUT", "1")
        result = CliRunner().invoke(app, ["runs", "--db", str(db)])
        assert result.exit_code == 1
        assert " ".join(result.output.split()).endswith(
            f"error: {db}: another process has held the store for more than 1 s; try again when it has "
            "finished")
        monkeypatch.setenv("GNQ_DB", str(db))
        at = app_page("main")
        assert not at.exception, [e.message for e in at.exception]
        assert at.error and "another process has held the store" in at.error[0].value
    finally:
        release(holder)
