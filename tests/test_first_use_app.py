"""What a first audit ran into on the dashboard (issue 18), each page run headless with AppTest."""

from __future__ import annotations

import pytest
from hostile.hostile_helpers import app_page, make_series

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    """Two tiny checkpoints with 24 positions."""
    return make_series(tmp_path_factory.mktemp("series") / "run", 2, max_length=24)


def test_the_form_offers_no_more_tokens_than_the_model_has(series, tmp_path, monkeypatch):
    monkeypatch.setenv("GNQ_DB", str(tmp_path / "gnq.duckdb"))
    at = app_page("new_audit", ckpt_mode="Local path", ckpt_path=str(series))
    assert not at.exception, [e.message for e in at.exception]
    field = next(n for n in at.number_input if n.label == "Max length (tokens)")
    assert field.value <= 24 and field.max == 24
    shown = " ".join(c.value for c in at.caption)
    assert "24 positions" in shown and "--max-length" not in shown


@pytest.mark.parametrize("name", ["runs", "trajectories", "flagged"])
def test_a_typo_in_the_store_path_is_refused_not_created(name, tmp_path, monkeypatch):
    monkeypatch.setenv("GNQ_DB", str(tmp_path / "gnq.duckdb"))
    typo = tmp_path / "gnq-typo" / "gnq.duckdb"
    at = app_page(name, db_path=str(typo))
    assert not at.exception, [e.message for e in at.exception]
    assert any("No store at" in e.value for e in at.error)
    assert not at.button and not (tmp_path / "gnq-typo").exists()
    new_audit = app_page("new_audit", db_path=str(typo))  # the page that creates a store says so
    assert any("starting an audit creates it" in c.value for c in new_audit.caption)
    assert not (tmp_path / "gnq-typo").exists()


def test_a_finished_job_links_to_its_results_with_start_and_duration(tmp_path, monkeypatch):
    from gnq_core.pipelines.jobs import Job

    db = tmp_path / "gnq.duckdb"
    monkeypatch.setenv("GNQ_DB", str(db))
    started = 1_700_000_000.0
    Job(job_id="20231114-221320-abcdef", run="my-audit", db=str(db), steps=[["audit"], ["extract"]],
        status="done", step=1, returncode=0, started=started, finished=started + 135).save()
    at = app_page("new_audit")
    shown = " ".join(m.value for m in at.markdown)
    assert "started 2023-11-1" in shown and "took 2 min 15 s" in shown
    link = next(b for b in at.button if b.label == "Open the results of my\\-audit")
    link.click().run()
    assert at.session_state["run_name"] == "my-audit" and at.query_params["run"] in ("my-audit", ["my-audit"])
