"""What a first audit ran into on the command line: λ = 0 left a failed run behind,
a typo in --db created an empty store, `gnq export` wanted --format beside `--out x.csv`,
`gnq runs` cut long names, a Trainer output folder was misread, and an audit of uploaded
checkpoints could not be attacked later."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hostile.hostile_helpers import make_series, write_texts_csv
from test_cli import fails as fails_with
from test_cli import gnq, runner

from gnq_core.cli import app
from gnq_core.results.store import Store

pytestmark = pytest.mark.slow


def fails(*args: object) -> str:
    """The one-line error, its wrapping undone."""
    return " ".join(fails_with(*args).split())


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """Two tiny checkpoints audited into a store under a long run name."""
    root = tmp_path_factory.mktemp("first-use")
    series = make_series(root / "series", 2, max_length=24)
    data = write_texts_csv(root / "texts.csv", 12)
    db = root / "gnq.duckdb"
    name = "a-rather-long-run-name-that-a-table-would-cut"
    gnq("audit", "--checkpoints", series, "--data", data, "--db", db, "--name", name, "--batch-size", 4,
        "--max-length", 16, "-q")
    return db, series, data, name


def test_lam_zero_is_refused_before_anything_is_written(audited, tmp_path):
    _, series, data, _ = audited
    db = tmp_path / "fresh.duckdb"
    message = fails("audit", "--checkpoints", series, "--data", data, "--db", db, "--lam", 0,
                    "--max-length", 16)
    assert "λ" in message and "> 0" in message
    assert not db.exists() or Store(db).runs().empty  # no failed run left behind
    help_text = " ".join(runner.invoke(app, ["audit", "--help"], terminal_width=200).output.split())
    lam_row = help_text.split("--lam", 1)[1].split("--", 1)[0].replace("│", "").replace(" ", "")
    assert "x>=0" not in lam_row and ">0" in lam_row


def test_reading_commands_refuse_a_store_that_does_not_exist(audited, tmp_path):
    db, _, _, name = audited
    typo = tmp_path / "gnq.duckbd"
    reads = (["runs"], ["export", "--run", name, "--out", tmp_path / "x.csv"], ["extract", "--run", name])
    for args in reads:
        assert "no such store" in fails(*args, "--db", typo)
    assert not typo.exists()
    assert not (tmp_path / "x.csv").exists()


def test_export_takes_the_format_from_the_file_name(audited, tmp_path):
    db, _, _, name = audited
    gnq("export", "--run", name, "--out", tmp_path / "flagged.jsonl", "--db", db, "-q")
    lines = (tmp_path / "flagged.jsonl").read_text().splitlines()
    assert len(lines) == 12 and "gnq_total" in json.loads(lines[0])
    assert "--format" in fails("export", "--run", name, "--out", tmp_path / "flagged.xls", "--db", db)


def test_runs_shows_long_names_whole(audited):
    db, _, _, name = audited
    out = gnq("runs", "--db", db)
    assert name in "".join(out.split()).replace("│", "")  # may wrap, never cut
    assert "…" not in out


def test_a_trainer_output_folder_lists_its_checkpoints(audited, tmp_path):
    """Trainer output: checkpoint-*/ plus the final model saved at the top (and often in final/ too)."""
    from gnq_core.sources.checkpoints.series import find_checkpoints

    _, series, _, _ = audited
    out = tmp_path / "trainer-out"
    shutil.copytree(series / "epoch-1", out / "checkpoint-10")
    shutil.copytree(series / "epoch-2", out / "checkpoint-20")
    shutil.copytree(series / "epoch-2", out / "final")
    for f in (series / "epoch-2").iterdir():  # trainer.save_model(out): the last weights, top level
        shutil.copy(f, out / f.name)
    assert [r.label for r in find_checkpoints(out)] == ["checkpoint-10", "checkpoint-20"]
    # a top-level model that differs from the last checkpoint is a later point, listed once
    for f in (series / "epoch-1").iterdir():
        shutil.copy(f, out / f.name)
    shutil.rmtree(out / "final")
    assert [r.label for r in find_checkpoints(out)] == ["checkpoint-10", "checkpoint-20", out.name]


def test_an_audit_of_uploaded_checkpoints_can_be_attacked_after_the_job(audited, tmp_path):
    """The dashboard deletes a job's uploads when it ends: the last checkpoint is kept for the
    attack, the others are recorded as gone and an attack on one says so in one line."""
    import time

    from gnq_core.jobs.jobs import list_jobs, start_job
    from gnq_core.jobs.uploads import uploads_dir

    _, series, data, _ = audited
    db = tmp_path / "gnq.duckdb"
    upload = uploads_dir(db, "job-1")
    shutil.copytree(series, upload / "checkpoints")
    shutil.copy(data, upload / "texts.csv")  # the dataset uploaded too
    gnq("audit", "--checkpoints", upload / "checkpoints", "--data", upload / "texts.csv", "--db", db,
        "--name", "up", "--batch-size", 4, "--max-length", 16, "-q")
    start_job("up", db, [], cleanup=[upload], job_id="job-1")  # a job whose steps are done: clean up
    deadline = time.monotonic() + 60
    while list_jobs(db)[0].status == "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list_jobs(db)[0].status == "done" and not upload.exists()
    # the run's provenance points at the kept copies, which exist (hashes unchanged)
    run = Store(db).run("up")
    assert Path(run.model_path).is_dir() and Path(run.dataset_path).is_file()
    from gnq_core.sources.datasets import load_texts
    assert load_texts(run.dataset_path).sha256 == run.dataset_hash
    out = gnq("extract", "--run", "up", "--prefix-tokens", 2, "--db", db)
    assert "epoch-2: 12 texts attacked" in " ".join(out.split())
    assert "deleted after the audit" in fails("extract", "--run", "up", "--checkpoint", "epoch-1", "--db", db)


def test_a_job_step_writes_its_progress_where_the_dashboard_reads_it(audited, tmp_path):
    """The job process runs its steps with run_job, in process (no `gnq` subprocess), and its one
    progress channel fills the file the page reads."""
    import signal

    from gnq_core.common.progress import seconds_left
    from gnq_core.jobs.jobs import Job, run_steps
    from gnq_core.pipelines.settings import AuditJob, AuditSettings, job_dict

    _, series, data, _ = audited
    step = AuditJob(checkpoints=str(series), data=str(data), name="p", settings=AuditSettings(batch_size=4,
                                                                                            max_length=16))
    job = Job(job_id="job-p", run="p", db=str(tmp_path / "gnq.duckdb"), steps=[job_dict(step)])
    job.log = str(job.path.with_suffix(".log"))
    job.save()
    handler = signal.getsignal(signal.SIGTERM)
    try:
        assert run_steps(job.path) == 0
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert Job.load(job.path).status == "done"
    state = job.progress()
    assert (state["label"], state["done"], state["total"], state["stage"]) == ("epoch-2", 12, 12, 2)
    assert state["planned_stages"] == 2
    assert seconds_left(state, now=state["updated"]) == 0


def test_checkpoints_saved_without_a_tokenizer_are_audited_with_tokenizer(audited, tmp_path):
    """Trainer checkpoints saved without tokenizer files are refused with the way out
    (--tokenizer, or processing_class=tokenizer); with --tokenizer the audit runs, records it, and
    the attack reads the texts with the same tokenizer."""
    from gnq_core.sources.checkpoints.files import TOKENIZER_FILES

    db, series, data, _ = audited
    bare = tmp_path / "bare"
    for k in (1, 2):
        shutil.copytree(series / f"epoch-{k}", bare / f"checkpoint-{k}")
        for f in (bare / f"checkpoint-{k}").iterdir():
            if f.name in (*TOKENIZER_FILES, "merges.txt", "special_tokens_map.json"):
                f.unlink()
    common = ["--data", data, "--db", tmp_path / "t.duckdb", "--batch-size", 4, "--max-length", 16, "-q"]
    said = fails("audit", "--checkpoints", bare, *common)
    assert "no tokenizer files" in said and "--tokenizer" in said and "processing_class=tokenizer" in said
    gnq("audit", "--checkpoints", bare, "--tokenizer", series / "epoch-1", "--name", "bare", *common)
    store = Store(tmp_path / "t.duckdb")
    assert store.run("bare").settings["tokenizer"] == str((series / "epoch-1").resolve())
    gnq("extract", "--run", "bare", "--db", tmp_path / "t.duckdb", "--prefix-tokens", 2, "--suffix-tokens", 2,
        "-q")
    assert len(store.extractions(store.run("bare").run_id)) == 12
