"""Job settings: one rule for each value, refused before anything is written, the same from the
CLI and from a job file (the dashboard's jobs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.jobs.jobs import Job
from gnq_core.pipelines.settings import (
    AuditJob,
    AuditSettings,
    DemoJob,
    ExtractJob,
    TrainJob,
    TrainSettings,
    job_dict,
    job_from_dict,
)
from gnq_core.results.records import RunSpec
from gnq_core.results.store import Store


@pytest.mark.parametrize("bad", [dict(lam=0.0), dict(lam=-1.0), dict(lam=float("nan")), dict(batch_size=1),
                                 dict(max_length=1), dict(dtype="int8"), dict(device="tpu")])
def test_audit_and_train_settings_share_one_rule(bad):
    for cls in (AuditSettings, TrainSettings):
        with pytest.raises(ValueError):
            cls(**bad)
    if "lam" in bad or "batch_size" in bad:  # a run description obeys the same rule
        with pytest.raises(ValueError):
            RunSpec(**(dict(name="r", kind="audit", lam=1e-2, batch_size=2, seed=0, max_length=8,
                            model_path="m", dataset_path="d", dataset_hash="h", n_examples=1,
                            code_version="c") | bad))


def test_settings_round_trip_through_json():
    jobs = [AuditJob(checkpoints="c", data="d.csv", name="n", settings=AuditSettings(lam=0.5, batch_size=4)),
            TrainJob(data="d.txt", out="o", settings=TrainSettings(epochs=2)),
            ExtractJob(run="n", threshold=0.5), DemoJob(epochs=3)]
    for job in jobs:
        assert job_from_dict(json.loads(json.dumps(job_dict(job)))) == job
    with pytest.raises(ValueError, match="kind must be one of"):
        job_from_dict({"kind": "rm -rf"})
    with pytest.raises(ValueError, match="audit settings"):
        job_from_dict({"kind": "audit", "checkpoints": "c", "data": "d", "surprise": 1})
    with pytest.raises(ValueError, match="λ"):
        job_from_dict(job_dict(jobs[0]) | {"settings": {"lam": 0}})


@pytest.mark.parametrize("option, value, message", [
    ("--lam", "0", "λ (--lam) must be"), ("--batch-size", "1", "--batch-size must be a whole number")])
def test_cli_refuses_bad_settings_before_writing(tmp_path, option, value, message):
    db = tmp_path / "gnq.duckdb"
    for command in (["audit", "--checkpoints", str(tmp_path)],
                    ["train", "--from-scratch", "--out", str(tmp_path)]):
        result = CliRunner().invoke(app, [*command, "--data", str(tmp_path / "nowhere.csv"), "--db", str(db),
                                          option, value])
        lines = result.output.strip().splitlines()
        assert result.exit_code == 1 and len(lines) == 1 and message in lines[0], result.output
    assert not db.exists() and list(tmp_path.iterdir()) == []


def test_gnq_job_runs_a_step_of_a_job_file_and_refuses_a_bad_one(tmp_path):
    db = tmp_path / "gnq.duckdb"
    job = Job(job_id="j", run="r", db=str(db), steps=[job_dict(ExtractJob(run="nope"))])
    job.path.write_text(json.dumps(job.__dict__))
    result = CliRunner().invoke(app, ["job", str(job.path), "--step", "0", "--db", str(db)])
    assert result.exit_code == 1 and "no such store" in result.output  # the extract step reads, never creates
    with Store(db).transaction():  # an empty store
        pass
    result = CliRunner().invoke(app, ["job", str(job.path), "--step", "0", "--db", str(db)])
    assert result.exit_code == 1 and "no run 'nope'" in result.output  # it ran the extract step
    result = CliRunner().invoke(app, ["job", str(job.path), "--step", "3", "--db", str(db)])
    assert result.exit_code == 1 and "no step 3" in result.output
    bad = {"steps": [{"kind": "extract", "run": "r", "threshold": 2}]}
    job.path.write_text(json.dumps(job.__dict__ | bad))
    result = CliRunner().invoke(app, ["job", str(job.path), "--db", str(db)])
    assert result.exit_code == 1 and "--threshold" in result.output


@pytest.mark.slow
def test_the_new_audit_page_starts_a_job_with_validated_settings(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from gnq_core.jobs import jobs
    from tests.hostile.hostile_helpers import make_series, write_texts_csv

    series, data = make_series(tmp_path / "series", 2), write_texts_csv(tmp_path / "texts.csv", 12)
    monkeypatch.setenv("GNQ_DB", str(tmp_path / "gnq.duckdb"))
    started = []
    monkeypatch.setattr(jobs, "start_job", lambda run, db, steps, **kw: started.append((run, steps)))
    page = Path(__file__).resolve().parents[2] / "gnq_core" / "dashboard" / "views" / "new_audit.py"
    at = AppTest.from_file(str(page), default_timeout=120).run()
    at.radio(key="ckpt_mode").set_value("Local path").run()
    at.text_input(key="ckpt_path").set_value(str(series)).run()
    at.radio(key="data_mode").set_value("Local path").run()
    at.text_input(key="data_path_input").set_value(str(data)).run()
    at.number_input[1].set_value(4)  # batch size
    at.button[0].click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    (run, steps), = started
    assert steps == [AuditJob(checkpoints=str(series), data=str(data), name=run, text_column="text",
                              group_column="group",
                              settings=AuditSettings(batch_size=4, max_length=32),  # the model's positions
                              threads=1),  # the form's default: one CPU thread on a shared machine
                     ExtractJob(run=run, threads=1)]


def test_the_cli_defaults_are_the_settings_types_defaults():
    """One definition: `gnq train` / `gnq audit` start from TrainSettings / AuditSettings."""
    import dataclasses

    import typer.main

    commands = {c.name: c for c in typer.main.get_command(app).commands.values()}
    for command, settings in (("train", TrainSettings), ("audit", AuditSettings)):
        defaults = {p.name: p.default for p in commands[command].params}
        fields = {f.name: f.default for f in dataclasses.fields(settings) if f.name in defaults}
        assert fields and all(defaults[k] == v for k, v in fields.items()), (command, fields, defaults)


def test_the_settings_types_import_without_torch():
    """The CLI reads them at import time; `gnq --help` must not wait for torch."""
    import subprocess
    import sys

    code = "import sys, gnq_core.cli; sys.exit('torch' in sys.modules or 'pandas' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_the_cli_and_the_form_map_the_same_options_to_the_same_job(tmp_path):
    """options.py is the one parsing of --companions and --batch-size and the one mapping to an
    AuditJob: the CLI's texts and the form's choices give equal jobs, and what neither is refused."""
    from gnq_core.pipelines.options import (
        COMPANION_CHOICES,
        audit_job,
        companion_choice,
        companions_option,
        parse_batch_size,
        parse_companions,
    )

    where = dict(checkpoints=tmp_path / "run", data=tmp_path / "t.csv")
    for typed, choice, n in ((None, "batch", 7), ("7", "n", 7), (" ALL ", "all", 7)):
        cli = audit_job(**where, companions=typed, batch_size=8, secret_patterns=["A-(\\d+)"])
        form = audit_job(**where, companions=companions_option(choice, n), batch_size=8.0,
                         secret_patterns=("A-(\\d+)",))
        assert cli == form and companion_choice(cli.settings.companions) == choice in COMPANION_CHOICES
        assert job_from_dict(json.loads(json.dumps(job_dict(cli)))) == cli  # as a job file reads it back
    assert audit_job(**where, companions="7").settings.companions == 7
    assert (parse_companions("12"), parse_companions("all"), parse_companions(None)) == (12, "all", None)
    assert parse_batch_size(16.0) == 16 and parse_batch_size("16") == 16
    for bad in (dict(companions="0"), dict(companions="some"), dict(companions="1.5"), dict(batch_size=16.5),
                dict(batch_size=1), dict(batch_size="x"), dict(reference="first")):
        with pytest.raises(ValueError):
            audit_job(**where, **bad)
