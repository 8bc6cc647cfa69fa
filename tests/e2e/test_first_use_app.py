"""What a first audit ran into on the dashboard, each page run headless with AppTest."""

from __future__ import annotations

import pytest
from hostile.hostile_helpers import ROOT, app_page, make_series
from streamlit.testing.v1 import AppTest

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
    from gnq_core.dashboard import state
    from gnq_core.jobs.jobs import Job

    db = tmp_path / "gnq.duckdb"
    monkeypatch.setenv("GNQ_DB", str(db))
    # the page on its own (no app/main.py, whose st.Page links another AppTest may have left here)
    monkeypatch.setattr(state, "PAGES", {})
    started = 1_700_000_000.0
    Job(job_id="20231114-221320-abcdef", run="my-audit", db=str(db), steps=[["audit"], ["extract"]],
        status="done", step=1, returncode=0, started=started, finished=started + 135).save()
    at = app_page("new_audit")
    shown = " ".join(m.value for m in at.markdown)
    assert "started 2023-11-1" in shown and "took 2 min 15 s" in shown
    link = next(b for b in at.button if b.label == "Open the results of my\\-audit")
    link.click().run()
    assert at.session_state["run_name"] == "my-audit" and at.query_params["run"] in ("my-audit", ["my-audit"])


@pytest.fixture(scope="module")
def scored_store(tmp_path_factory):
    """A store with two audits of the same 12 texts over 3 checkpoints (numbers made up, written
    through the store's own API); texts 0 and 1 have the same GNQ trajectory up to rounding."""
    import numpy as np
    import pandas as pd

    from gnq_core.results.records import RunSpec, ScoreColumns, batch_results
    from gnq_core.results.store import Store

    db = tmp_path_factory.mktemp("scored") / "gnq.duckdb"
    store = Store(db)
    n = 12
    examples = pd.DataFrame({"example_id": range(n), "text": [f"text number {i}" for i in range(n)],
                             "grp": ["common" if i % 2 else "surprising" for i in range(n)],
                             "n_tokens": [5] * n})
    for seed, name in enumerate(("made-up-2", "made-up")):  # the second one is the newest, picked first
        run = store.create_run(RunSpec(name=name, kind="audit", lam=0.01, batch_size=4, seed=0, max_length=8,
                                       model_path="m", dataset_path="d.csv", dataset_hash="abc", n_examples=n,
                                       code_version="test", device="cpu", dtype="float64"), examples)
        store.add_points(run.run_id, [dict(point=p, label=f"epoch-{p + 1}", kind="checkpoint")
                                      for p in range(3)])
        rng = np.random.default_rng(seed)
        for p in range(3):
            gnq = rng.lognormal(size=n) / 3
            gnq[1] = gnq[0] * (1 + 1e-12)  # the same trajectory but for float rounding
            loss, influence = rng.uniform(1, 3, n), rng.uniform(size=n)
            texts, batches = ScoreColumns(), []
            for b in range(3):
                ids = list(range(4 * b, 4 * b + 4))
                t, batch = batch_results(ids, loss[ids], gnq[ids], influence[ids],
                                         batch_index=b, step=None, condition=3.0, finite=True, seconds=0.1)
                texts.add(t)
                batches.append(batch)
            store.write_point(run.run_id, p, texts, batches, 0.1)
    return db


def test_small_things_on_the_pages(scored_store, monkeypatch):
    monkeypatch.setenv("GNQ_DB", str(scored_store))
    # the uploader's label shows its '*' (Markdown would turn "epoch-*, checkpoint-*" into italics)
    at = app_page("new_audit")
    label = at.get("file_uploader")[0].proto.label
    assert "epoch-\\*" in label and "checkpoint-\\*" in label
    # "Highlight top/bottom k" = 3 lists 3 highest and 3 lowest
    at = app_page("trajectories")
    assert [len(d.value) for d in at.dataframe] == [3, 3]
    # Groups: checkpoints named as in the run, not numbered from 0
    at = app_page("groups")
    assert at.dataframe[0].value["checkpoint"].tolist() == ["epoch-1", "epoch-2", "epoch-3"]
    assert "point" not in at.dataframe[0].value.columns
    # drill-down: the identical trajectory's distance is 0, not 4e-13
    at = app_page("drilldown", run_name="made-up", example_id=0)
    near = at.dataframe[-1].value
    assert near.loc[near["example_id"] == 1, "distance"].item() == 0


def test_the_band_is_grey_as_the_caption_says_and_the_legend_clears_the_colour_bar():
    import re

    import pandas as pd

    from gnq_core.dashboard import charts

    band = pd.DataFrame({"point": [0, 1], "label": ["a", "b"], "q10": [1, 1], "q50": [2, 2], "q90": [3, 3]})
    fig = charts.trajectories(pd.DataFrame(), band=band)
    fill = next(t.fillcolor for t in fig.data if t.fill == "tonexty")
    r, g, b = map(int, re.findall(r"\d+", fill)[:3])
    assert r == g == b  # grey
    fig = charts.regression_data([0, 1, 2], [1, 2, 0], 0.5, 0.5, 1, [0.1, 0.2, 3.0])
    colorbar_x = fig.data[-1].marker.colorbar.x
    assert fig.layout.legend.orientation == "h" and fig.layout.legend.y >= 1
    assert colorbar_x is None or colorbar_x >= 1


def test_the_landing_page_shows_the_demo_build_at_once_while_the_store_is_busy(tmp_path, monkeypatch):
    """A demo job is running and another process holds the store (as the demo's writes do on a
    busy machine): the Runs page answers within 2 s with the stage, the count and an estimate."""
    import json
    import os
    import subprocess
    import sys
    import time

    import duckdb

    from gnq_core.jobs.jobs import Job

    db = tmp_path / "gnq.duckdb"
    duckdb.connect(str(db)).close()
    monkeypatch.setenv("GNQ_DB", str(db))
    hold = ("import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('held', flush=True); "
            "time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        now = time.time()
        job = Job(job_id="20261123-090000-abcdef", run="demo", db=str(db), steps=[["demo"]],
                  status="running", pid=holder.pid, started=now - 40)
        job.save()
        job.progress_path.write_text(json.dumps({
            "label": "epoch 3/12", "done": 32, "total": 64, "stage": 3, "planned_stages": 26,
            "started": now - 40, "stage_started": now - 5, "updated": now}))
        t0 = time.perf_counter()
        at = app_page("runs")
        seconds = time.perf_counter() - t0
    finally:
        holder.kill()
        holder.wait()
    assert seconds < 2.0, seconds
    bar = at.get("progress")[0].proto
    assert "epoch 3/12: 32/64 texts" in bar.text and "stage 3 of 26" in bar.text and "left" in bar.text
    # this stage: 32 in 5 s, 32 to go; 23 stages after it as long as the first two were (35 s)
    assert "about 5 s left in this stage, about 6 min 47 s in all" in bar.text
    assert os.path.exists(db)


def test_the_dataset_map_filters_its_table_to_the_selected_points(scored_store, monkeypatch):
    monkeypatch.setenv("GNQ_DB", str(scored_store))
    at = app_page("dataset_map")
    assert not at.exception and len(at.dataframe[0].value) == 12
    # a lasso selection on the map arrives as plotly points whose customdata[0] is the example id
    selection = {"points": [{"customdata": [3, "t"]}, {"customdata": [5, "t"]}], "point_indices": [],
                 "box": [], "lasso": [{"x": [0, 1, 1], "y": [0, 0, 1]}]}
    at = app_page("dataset_map", map_chart={"selection": selection})
    assert sorted(at.dataframe[0].value["example_id"]) == [3, 5]
    assert any("2 texts selected" in c.value for c in at.caption)


def test_compare_two_runs_and_share_the_view_by_its_address(scored_store, monkeypatch):
    from gnq_core.analysis.compare import compare_runs
    from gnq_core.results.store import Store

    monkeypatch.setenv("GNQ_DB", str(scored_store))
    at = app_page("compare", compare_top=3)
    assert not at.exception, [e.message for e in at.exception]
    assert at.selectbox(key="compare_vs").value == "made-up-2"
    store = Store(scored_store)
    expected = compare_runs(store.example_totals(store.run("made-up").run_id),
                            store.example_totals(store.run("made-up-2").run_id), top=3)
    entered, left = at.dataframe[0].value, at.dataframe[1].value
    assert sorted(entered["example_id_b"]) == sorted(expected.entered["example_id_b"])
    assert sorted(left["example_id_b"]) == sorted(expected.left["example_id_b"])
    assert [m.value for m in at.metric][:1] == ["12"]
    # the address carries the view: run and the run compared with
    assert at.query_params["run"] in ("made-up", ["made-up"])
    assert at.query_params["vs"] in ("made-up-2", ["made-up-2"])


def test_a_shared_address_opens_the_same_text(scored_store, monkeypatch):
    monkeypatch.setenv("GNQ_DB", str(scored_store))
    at = AppTest.from_file(str(ROOT / "gnq_core" / "dashboard" / "views" / "drilldown.py"),
                           default_timeout=60)
    at.query_params["run"] = "made-up-2"
    at.query_params["text"] = "7"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.selectbox(key="run_picker").value == "made-up-2"
    assert next(s for s in at.selectbox if s.label == "Example").value == 7
    assert at.session_state["example_id"] == 7
    assert at.query_params["text"] in ("7", ["7"])


def _downloads(at: AppTest) -> list:
    return [b.proto for b in at.get("download_button")]


def test_downloads_are_disabled_for_an_empty_filtered_view(scored_store, monkeypatch):
    monkeypatch.setenv("GNQ_DB", str(scored_store))
    at = app_page("flagged")
    assert not at.exception, [e.message for e in at.exception]
    assert len(_downloads(at)) == 3 and not any(b.disabled for b in _downloads(at))
    at.text_input(key="flagged_search").set_value("no text says this").run()
    assert at.dataframe[0].value.empty
    assert len(_downloads(at)) == 3 and all(b.disabled for b in _downloads(at))
    assert any("Nothing to export" in c.value for c in at.caption)


def _flagged_rows(at: AppTest) -> list[int]:
    assert not at.exception, [e.message for e in at.exception]
    return at.dataframe[0].value["example_id"].tolist()


def test_the_flagged_view_is_in_its_address_and_opens_from_it(scored_store, monkeypatch):
    from gnq_core.analysis.verdict import rank_texts
    from gnq_core.results.store import Store

    monkeypatch.setenv("GNQ_DB", str(scored_store))
    store = Store(scored_store)
    ranked = rank_texts(store.example_totals(store.run("made-up-2").run_id))
    # a shared address: run, order, flag by top-k with k = 6, one group
    at = AppTest.from_file(str(ROOT / "gnq_core" / "dashboard" / "views" / "flagged.py"), default_timeout=60)
    for key, value in {"run": "made-up-2", "order": "GNQ_total alone", "flag": "top-k", "k": "6",
                       "group": "common"}.items():
        at.query_params[key] = value
    at.run()
    top6 = ranked.sort_values("gnq_rank").head(6)
    expected = top6[top6["group"] == "common"].sort_values(["gnq_rank", "example_id"])
    assert _flagged_rows(at) == expected["example_id"].tolist() and len(expected) < 6
    assert at.radio(key="flagged_order").value == "GNQ_total alone"
    assert at.number_input(key="flagged_k").value == 6
    assert at.multiselect(key="flagged_groups").value == ["common"]
    # changing a filter changes the address
    at.number_input(key="flagged_k").set_value(9).run()
    at.text_input(key="flagged_search").set_value("number 1").run()
    params = dict(at.query_params)
    assert params["k"] in ("9", ["9"]) and params["q"] in ("number 1", ["number 1"])
    rows = _flagged_rows(at)
    # that address, opened in a fresh session, shows exactly the same rows
    fresh = AppTest.from_file(str(ROOT / "gnq_core" / "dashboard" / "views" / "flagged.py"),
                              default_timeout=60)
    for key, value in params.items():
        fresh.query_params[key] = value
    fresh.run()
    assert _flagged_rows(fresh) == rows and rows
    # back at the defaults, the address drops them; another mode forgets k
    at.radio(key="flagged_mode").set_value("percentile").run()
    assert "k" not in at.query_params and at.query_params["flag"] in ("percentile", ["percentile"])
    at.radio(key="flagged_order").set_value("Verdict (leaked, secret-like, risk)").run()
    assert "order" not in at.query_params


def test_an_address_value_the_page_does_not_offer_is_named_and_ignored(scored_store, monkeypatch):
    monkeypatch.setenv("GNQ_DB", str(scored_store))
    at = AppTest.from_file(str(ROOT / "gnq_core" / "dashboard" / "views" / "flagged.py"), default_timeout=60)
    at.query_params["k"] = "many"
    at.query_params["group"] = "nonexistent"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert len(at.warning) == 2 and "`k`" in at.warning[0].value
    assert at.number_input(key="flagged_k").value == 12 and len(at.dataframe[0].value) == 12


def test_the_compare_top_k_is_in_the_address(scored_store, monkeypatch):
    monkeypatch.setenv("GNQ_DB", str(scored_store))
    at = AppTest.from_file(str(ROOT / "gnq_core" / "dashboard" / "views" / "compare.py"), default_timeout=60)
    at.query_params["top"] = "4"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.number_input(key="compare_top").value == 4
    assert any(m.label == "Entered the top 4" for m in at.metric)
    at.number_input(key="compare_top").set_value(5).run()
    assert at.query_params["top"] in ("5", ["5"])
    at.number_input(key="compare_top").set_value(20).run()  # the default: left out of the link
    assert "top" not in at.query_params


def _filled_form(series, tmp_path, monkeypatch):
    """New audit with checkpoints and texts given; starting a job records its steps instead."""
    from gnq_core.jobs import jobs

    monkeypatch.setenv("GNQ_DB", str(tmp_path / "gnq.duckdb"))
    data = tmp_path / "texts.txt"
    data.write_text("\n".join(f"text number {i} of the form test" for i in range(8)) + "\n")
    started = []
    monkeypatch.setattr(jobs, "start_job", lambda name, db, steps, **kw: started.append(steps))
    at = app_page("new_audit", ckpt_mode="Local path", ckpt_path=str(series), data_mode="Local path",
                  data_path_input=str(data))
    return at, started


def test_the_form_passes_the_loss_and_lambda_scale_to_the_job(series, tmp_path, monkeypatch):
    """The loss convention and λ scale are chosen on the form and reach the
    audit job's settings; the defaults stay token mean and absolute λ."""
    at, started = _filled_form(series, tmp_path, monkeypatch)
    assert not at.exception, [e.message for e in at.exception]
    loss = next(s for s in at.selectbox if s.label == "Loss per text (ℓ_j)")
    scale = next(s for s in at.selectbox if s.label == "λ scale")
    assert (loss.value, scale.value) == ("token_mean", "absolute")
    loss.set_value("token_sum")
    scale.set_value("relative")
    next(b for b in at.button if b.label == "Start audit").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    settings = started[0][0].settings
    assert (settings.loss, settings.lam_mode) == ("token_sum", "relative")


def test_the_form_sets_the_jobs_threads_and_reference_model(series, tmp_path, monkeypatch):
    """The job uses 1 CPU thread by default (README's advice on a shared machine) or the
    number given, and the attack's reference is the model folder typed (a fine-tune's base); a
    reference that is no model is refused on the page, no job started."""
    monkeypatch.setenv("GNQ_DATA_ROOTS", "/")
    at, started = _filled_form(series, tmp_path, monkeypatch)
    assert at.number_input(key="threads").value == 1
    at.text_input(key="reference_path").set_value(str(tmp_path / "no-model"))
    next(b for b in at.button if b.label == "Start audit").click().run()
    assert not at.exception, [e.message for e in at.exception]
    assert not started and any("no such folder" in e.value for e in at.error), [e.value for e in at.error]
    base = sorted(series.iterdir())[0]
    at.text_input(key="reference_path").set_value(str(base))
    at.number_input(key="threads").set_value(2)
    next(b for b in at.button if b.label == "Start audit").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    audit, extract = started[0]
    assert audit.threads == 2 and extract.threads == 2 and extract.reference == str(base)


def test_the_form_offers_the_companion_set_of_the_cli(series, tmp_path, monkeypatch):
    """The form offers --companions N|all and --sketch-k with the CLI's defaults (its
    batch; AuditSettings.sketch_k), explains the companion set and that its numbers are sketched
    with a measured error, and passes the choice to the audit job's settings."""
    from gnq_core.pipelines import AuditSettings

    at, started = _filled_form(series, tmp_path, monkeypatch)
    assert not at.exception, [e.message for e in at.exception]
    choice = at.selectbox(key="form_companions")
    assert choice.value == "batch" and at.number_input(key="form_sketch_k").value == AuditSettings.sketch_k
    shown = " ".join(c.value for c in at.caption)
    assert "Companion set" in shown and "sketched" in shown and "measured error" in shown
    def start() -> None:
        next(b for b in at.button if b.label == "Start audit").click().run()

    start()
    settings = started[-1][0].settings
    assert (settings.companions, settings.sketch_k) == (AuditSettings.companions, AuditSettings.sketch_k)
    at.selectbox(key="form_companions").set_value("n")
    at.number_input(key="form_companions_n").set_value(5)
    at.number_input(key="form_sketch_k").set_value(256)
    start()
    assert not at.exception and not at.error, [e.value for e in at.error]
    settings = started[-1][0].settings
    assert (settings.companions, settings.sketch_k) == (5, 256)
    at.selectbox(key="form_companions").set_value("all")
    start()
    assert started[-1][0].settings.companions == "all"
