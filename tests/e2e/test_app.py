"""Every dashboard page, run headless with streamlit's AppTest against a small real store and an
empty one: no exception, and the expected widgets and numbers present."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import plotly.io
import pytest
from lm_fixtures import texts
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

from gnq_core.analysis.verdict import rank_texts
from gnq_core.cli import app as cli
from gnq_core.results.store import Store

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
PAGES = ["runs", "new_audit", "trajectories", "extraction", "groups", "drilldown", "flagged", "regression"]


@pytest.fixture(scope="module")
def store_path(tmp_path_factory) -> Path:
    """A real store: a tiny model trained from scratch with in-run GNQ, audited, attacked."""
    root = tmp_path_factory.mktemp("app")
    data = root / "texts.csv"
    rows = list(texts(32))
    pd.DataFrame({"text": rows, "group": ["common" if i % 2 else "surprising" for i in range(32)]}).to_csv(
        data, index=False)
    db = root / "gnq.duckdb"
    runner = CliRunner()
    for args in (["train", "--data", data, "--from-scratch", "--epochs", 2, "--batch-size", 8,
                  "--max-length", 24, "--vocab-size", 400, "--out", root / "run", "--db", db, "-q"],
                 ["audit", "--checkpoints", root / "run", "--data", data, "--db", db, "--name", "audited",
                  "--batch-size", 8, "--max-length", 24, "-q"],
                 ["extract", "--run", "audited", "--prefix-tokens", 4, "--db", db, "-q"]):
        result = runner.invoke(cli, [str(a) for a in args])
        assert result.exit_code == 0, result.output
    return db


def page(name: str, db: Path, monkeypatch, **state) -> AppTest:
    monkeypatch.setenv("GNQ_DB", str(db))
    at = AppTest.from_file(str(ROOT / "gnq_core" / "dashboard" / "views" / f"{name}.py"), default_timeout=60)
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def texts_of(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption] + [t.value for t in at.title]
    parts += [str(m.value) for m in at.metric] + [i.value for i in at.info] + [h.value for h in at.subheader]
    return "\n".join(str(p) for p in parts)


@pytest.mark.parametrize("name", PAGES)
def test_every_page_runs_on_an_empty_store(name, tmp_path, monkeypatch):
    at = page(name, tmp_path / "empty.duckdb", monkeypatch)
    if name == "runs":
        assert any(b.label == "Build the demo run" for b in at.button)
    elif name not in ("new_audit", "regression"):
        assert "no runs yet" in texts_of(at)
    assert not (tmp_path / "empty.duckdb").exists() or name == "new_audit"


def test_runs_page(store_path, monkeypatch):
    at = page("runs", store_path, monkeypatch, run_name="audited")
    shown = texts_of(at)
    assert "Top flagged texts" in shown and "audited" in shown
    assert "What GNQ is on this run." in shown and "gradient norm" in shown
    tiles = {m.label: m.value for m in at.metric}
    assert tiles["Examples"] == "32"
    # the leak tiles come first, above the headline: a new user's first screen
    assert [m.label for m in at.metric][:2] == ["Leaked", "Partly leaked"]
    runs = at.dataframe[0].value
    assert set(runs["name"]) == {"audited", "run"}
    # partial leaks have a tile of their own; the risk's basis is said beside the ranking
    ranked = rank_texts(Store(store_path).example_totals(Store(store_path).run("audited").run_id))
    tiles = {m.label: m.value for m in at.metric}
    assert tiles["Partly leaked"] == f"{(ranked['status'] == 'partly leaked').sum()} / 32"
    said = [c.value for c in [*at.caption, *at.warning] if "Memorisation risk" in c.value]
    assert said and f"Memorisation risk: {ranked.attrs['risk_label']}" in said[0].replace("\\", "")


def test_trajectories_page(store_path, monkeypatch):
    at = page("trajectories", store_path, monkeypatch, run_name="audited")
    assert "Highest and lowest" in texts_of(at)
    assert len(at.dataframe) == 2 and len(at.dataframe[0].value) == 3  # the k = 3 highlighted


def test_extraction_page(store_path, monkeypatch):
    at = page("extraction", store_path, monkeypatch, run_name="audited")
    table = at.dataframe[0].value
    assert list(table["fraction"]) == [0.05, 0.10, 0.20]
    assert "texts attacked" in texts_of(at)
    at.slider[1].set_value(0.5).run()
    assert not at.exception
    # The predictive-power table: one row per signal, with its direction and intervals.
    assert "Which signal predicts extraction?" in texts_of(at)
    power = next(d.value for d in at.dataframe if "AUC" in d.value.columns)
    assert {"GNQ_total", "loss", "text length (tokens)"} <= set(power["signal"])
    assert set(power["direction"]) <= {"higher = extracted", "lower = extracted"}
    assert (power["texts"] == 32).all()
    assert "bootstrap resamples of copy clusters" in texts_of(at)
    # the length control and the gain over length + loss are columns of one table per
    # outcome; the tiny model extracts nothing here, so the groups' table is the one scored
    assert "No signal can be scored against extraction" in texts_of(at)
    groups = next(d.value for d in at.dataframe if "AUC (all texts)" in d.value.columns)
    wanted = {"AUC within exact length", "CV AUC gain over length + loss", "TPR @ 0.1% FPR"}
    assert wanted <= set(groups.columns)
    assert set(groups["direction"]) <= {"higher = common", "lower = common"}
    # The report: prepared on a click, then offered as a download of one HTML file.
    at.button[0].click().run()
    assert not at.exception
    assert any("Download the report" in str(b.proto.label) for b in at.get("download_button"))
    # A run without an attack says how to run one.
    at = page("extraction", store_path, monkeypatch, run_name="run")
    assert "gnq extract" in texts_of(at)


def test_groups_page(store_path, monkeypatch):
    at = page("groups", store_path, monkeypatch, run_name="audited")
    sep = at.dataframe[0].value
    assert len(sep) == 2 and sep["auc"].between(0, 1).all()


def test_drilldown_page_shows_one_example(store_path, monkeypatch):
    store = Store(store_path)
    run = store.run("audited")
    top = rank_texts(store.example_totals(run.run_id)).iloc[0]
    at = page("drilldown", store_path, monkeypatch, run_name="audited", example_id=int(top["example_id"]))
    assert at.code[0].value == top["text"]  # wrapped, readable, never Markdown
    assert at.metric[0].value.startswith(f"{top['rank']} /")
    assert "Extraction attempt" in texts_of(at)
    verdict = [a.value for a in (*at.error, *at.warning, *at.info)]
    assert any(top["status"] in v for v in verdict)  # the status and its reason, in words
    assert not any(f"{top['status']}: {top['status']}:" in v.replace("*", "") for v in verdict)
    assert any("What to do:" in v for v in verdict)
    helps = {m.label: m.proto.help for m in at.metric}
    assert "1 = look at this text first" in helps["Rank"] and "1 = unique" in helps["Copies"]
    assert "reference" in helps["Loss ratio"]


def _column_help(element) -> dict[str, str]:
    return {c: v.get("help", "") for c, v in json.loads(element.proto.columns).items()}


def test_flagged_page_orders_by_verdict_with_reasons_tooltips_and_a_gnq_switch(store_path, monkeypatch):
    store = Store(store_path)
    ranked = rank_texts(store.example_totals(store.run("audited").run_id))
    at = page("flagged", store_path, monkeypatch, run_name="audited")
    shown = at.dataframe[0].value
    assert list(shown["example_id"]) == list(ranked["example_id"])  # the verdict order by default
    assert {"rank", "status", "reason", "risk", "copies", "secret", "gnq_rank", "gnq_with_copy", "extracted",
            "reference_match", "loss_ratio", "zlib_ratio", "min_k_prob"} <= set(shown.columns)
    assert shown["reason"].str.len().min() > 0
    helps = _column_help(at.dataframe[0])
    for column in ("rank", "percentile", "reason", "risk", "gnq_total", "copies", "gnq_with_copy", "secret",
                   "extracted", "reference_match", "loss_ratio", "zlib_ratio", "min_k_prob"):
        assert helps.get(column), f"{column} has no tooltip"
    assert "≈ 1" in helps["gnq_total"] and "4× below" in helps["loss_ratio"]
    assert r"Attack rule: extracted \= given the first 4 tokens" in texts_of(at)  # escaped Markdown
    at.radio(key="flagged_order").set_value("GNQ_total alone").run()
    by_gnq = at.dataframe[0].value
    assert by_gnq["gnq_total"].iloc[0] == pytest.approx(ranked["gnq_total"].max())
    assert list(by_gnq["gnq_rank"]) == sorted(by_gnq["gnq_rank"])
    at.toggle[0].set_value(True).run()
    assert at.dataframe[0].value["secret"].notna().all()


def test_runs_page_shows_what_leaked_first(store_path, monkeypatch):
    at = page("runs", store_path, monkeypatch, run_name="audited")
    assert at.subheader[0].value.startswith("What leaked from")
    store = Store(store_path)
    ranked = rank_texts(store.example_totals(store.run("audited").run_id))
    leaked = ranked[ranked["status"].isin(["leaked", "partly leaked"])]
    if leaked.empty:
        assert at.success[0].value.startswith("No text leaked\\.")  # Markdown-escaped
    else:
        table = at.dataframe[0].value
        assert list(table["example_id"]) == list(leaked["example_id"]) and table["reason"].str.len().min() > 0
        assert _column_help(at.dataframe[0])["reason"]
    top = at.dataframe(key="runs_top").value
    assert list(top["example_id"]) == list(ranked["example_id"][:20]) and "reason" in top.columns


def test_flagged_page_filters_and_downloads(store_path, monkeypatch):
    at = page("flagged", store_path, monkeypatch, run_name="audited")
    assert len(at.dataframe[0].value) == 32  # k defaults to min(50, n)
    at.number_input[0].set_value(5).run()
    assert len(at.dataframe[0].value) == 5
    assert "5 of 32 texts" in texts_of(at)


def test_new_audit_page_has_its_inputs(store_path, monkeypatch):
    at = page("new_audit", store_path, monkeypatch)
    labels = {r.label for r in at.radio}
    assert {"Checkpoints", "Dataset"} <= labels
    at.radio(key="ckpt_mode").set_value("Local path").run()
    at.text_input(key="ckpt_path").set_value(str(store_path.parent / "run")).run()
    assert "2 checkpoint(s)" in texts_of(at)
    at.text_input(key="ckpt_path").set_value(str(store_path.parent / "nowhere")).run()
    assert at.error and "nowhere" in at.error[0].value
    # a dataset: how many secret-like values the secret attack will probe, its columns offered
    data = store_path.parent / "records.csv"
    texts = ["Card number: 4929 1830 5527 6614, PIN 4821", "plain news", "Call +91 98450 22713"]
    pd.DataFrame({"text": texts,
                  "pii": [None, "news", None], "public": ["no", "yes", "no"]}).to_csv(data, index=False)
    at.radio(key="data_mode").set_value("Local path").run()
    at.text_input(key="data_path_input").set_value(str(data)).run()
    assert "3 secret-like values in 2 texts" in texts_of(at)
    at.selectbox(key="public_column").set_value("public").run()
    at.selectbox(key="secret_column").set_value("pii").run()
    assert "3 secret-like values in 2 texts" in texts_of(at)  # "news" is in a public text: not searched
    assert not at.exception, [e.message for e in at.exception]



FORM_FIELDS = ("Run name", "λ", "Batch size", "Max length (tokens)", "Seed", "Prefix tokens", "Suffix tokens",
               "CPU threads", "Secret candidates")


def _form_fields(at: AppTest) -> dict[str, object]:
    """The settings form's fields by label."""
    return {w.label: w for w in (*at.text_input, *at.number_input) if w.label in FORM_FIELDS}


def test_new_audit_keeps_typed_values_when_checkpoints_and_data_arrive(store_path, monkeypatch):
    """Values typed into the form survive the reruns an upload or a typed path causes.
    The browser holds a form's typed values until Start and keeps them across a rerun only while
    each field keeps its identity; before, a default, limit or name that changed with the
    checkpoints (Run name, Max length) made a new field, at its default. A value the form holds
    (session state, as Start leaves it) survives too. Once the model and texts are known, an
    estimate of the audit's time, with its basis, shows beside Start."""
    at = page("new_audit", store_path, monkeypatch, form_name="typed-name", form_max_length=16, form_batch=4)
    before = {label: w.id for label, w in _form_fields(at).items()}
    assert set(before) == set(FORM_FIELDS)
    assert "Estimated time" not in texts_of(at)  # nothing to estimate before a model and texts
    # the checkpoints arrive: the default name (the folder's) and the token limit (24) change
    at.radio(key="ckpt_mode").set_value("Local path").run()
    at.text_input(key="ckpt_path").set_value(str(store_path.parent / "run")).run()
    assert "2 checkpoint(s)" in texts_of(at)
    at.radio(key="data_mode").set_value("Local path").run()
    at.text_input(key="data_path_input").set_value(str(store_path.parent / "texts.csv")).run()
    assert not at.exception, [e.message for e in at.exception]
    fields = _form_fields(at)
    assert {label: w.id for label, w in fields.items()} == before
    assert fields["Run name"].value == "typed-name" and fields["Run name"].placeholder.startswith("run ")
    assert fields["Max length (tokens)"].value == 16 and fields["Max length (tokens)"].max == 24
    assert fields["Batch size"].value == 4
    shown = texts_of(at)
    assert "Estimated time: about" in shown and "rough estimate:" in shown
    assert "32 texts × 2 checkpoint(s)" in shown and "docs/performance.md" in shown
    assert "**Memory:** peak memory ≈" in shown and "at batch 4 × 16 tokens" in shown  # beside the time
    # measured on the model itself: the total beside Start, each stage with its count and noun
    at.button(key="measure_estimate").click().run()
    assert not at.exception, [e.message for e in at.exception]
    shown = texts_of(at)
    assert "measured on this machine" in shown and "rough estimate" not in shown
    assert "**gradient audit**" in shown and "for 64 texts" in shown  # 32 texts × 2 checkpoints


def test_a_disabled_start_says_why(store_path, monkeypatch):
    """Start audit is off until checkpoints and a dataset are there, and the caption beside it says
    which is missing (an upload in progress reads as not there yet)."""
    at = page("new_audit", store_path, monkeypatch)
    start = next(b for b in at.button if b.label == "Start audit")
    assert start.disabled
    shown = texts_of(at)
    assert "Start audit is off until the checkpoint folder has finished uploading" in shown
    assert "the dataset has finished uploading" in shown
    at.radio(key="ckpt_mode").set_value("Local path").run()
    at.text_input(key="ckpt_path").set_value(str(store_path.parent / "run")).run()
    at.radio(key="data_mode").set_value("Local path").run()
    shown = texts_of(at)
    assert "checkpoint folder" not in shown.split("Start audit is off until")[1].split("\n")[0]
    assert "Start audit is off until a dataset file is given in 2." in shown
    at.text_input(key="data_path_input").set_value(str(store_path.parent / "texts.csv")).run()
    assert "Start audit is off" not in texts_of(at)
    assert not next(b for b in at.button if b.label == "Start audit").disabled

def test_regression_page_outlier_is_outside_the_ellipse(tmp_path, monkeypatch):
    at = page("regression", tmp_path / "none.duckdb", monkeypatch)
    table = at.dataframe[0].value
    assert table.loc[table["gnq"].idxmax(), "index"] == 6
    at.text_area[0].set_value("0, 0\n1, x").run()
    assert at.error and "line 2" in at.error[0].value


def test_dataset_map_colour_is_in_the_address(store_path, monkeypatch):
    monkeypatch.setenv("GNQ_DB", str(store_path))
    at = AppTest.from_file(str(ROOT / "gnq_core" / "dashboard" / "views" / "dataset_map.py"),
                           default_timeout=60)
    at.query_params["run"] = "audited"
    at.query_params["colour"] = "attack verdict"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.radio(key="map_colour").value == "attack verdict"
    legend = {t.name for t in plotly.io.from_json(at.get("plotly_chart")[0].proto.spec).data}
    assert legend & {"extracted", "not extracted"}
    at.radio(key="map_colour").set_value("group").run()
    assert "colour" not in at.query_params
    at.radio(key="map_colour").set_value("attack verdict").run()
    assert at.query_params["colour"] in ("attack verdict", ["attack verdict"])


# ----------------------------------------------------------------------------- accessibility
VIEWS = sorted(p.stem for p in (ROOT / "gnq_core" / "dashboard" / "views").glob("*.py"))
VARIANTS = [(name, {}) for name in VIEWS] + [
    ("flagged", {"flagged_mode": "percentile"}), ("flagged", {"flagged_mode": "GNQ threshold"}),
    ("new_audit", {"ckpt_mode": "Local path", "data_mode": "Local path"})]


def _elements(at: AppTest) -> list:
    """Every element of the page (sidebar, then main), in the order a screen reader meets them."""
    found = []

    def walk(node) -> None:
        children = getattr(node, "children", None)
        if children is None:
            found.append(node)
            return
        for key in sorted(children):
            walk(children[key])
    walk(at.sidebar)
    walk(at.main)
    return found


@pytest.mark.parametrize(("name", "state"), VARIANTS, ids=[f"{n}-{'-'.join(s.values()) or 'default'}"
                                                          for n, s in VARIANTS])
def test_every_widget_has_a_label_and_every_chart_a_text_alternative(store_path, monkeypatch, name, state):
    """A screen reader names a widget by its label (label_visibility="collapsed" keeps it for them);
    a chart is an image to it, so the caption below each one says what it shows."""
    at = page(name, store_path, monkeypatch, run_name="audited", example_id=0, **state)
    elements = _elements(at)
    unlabelled = [f"{e.type} {getattr(e, 'key', '')}" for e in elements
                  if hasattr(e, "proto") and "label" in e.proto.DESCRIPTOR.fields_by_name
                  and not str(e.proto.label).strip()]
    assert not unlabelled, unlabelled
    charts_seen = 0
    for i, e in enumerate(elements):
        if e.type != "plotly_chart":
            continue
        charts_seen += 1
        assert e.proto.theme == "streamlit"  # drawn in the viewer's light or dark theme
        alt = elements[i + 1] if i + 1 < len(elements) else None
        assert alt is not None and alt.type == "caption" and len(alt.value) > 20, \
            f"chart {charts_seen} of {name} has no caption saying what it shows"
    if name in ("runs", "trajectories", "extraction", "groups", "drilldown", "dataset_map", "regression"):
        assert charts_seen, f"{name} shows no chart (the check above saw nothing)"


def test_runs_page_writes_the_cleaned_training_data_with_the_cli_function(store_path, monkeypatch, tmp_path):
    out = tmp_path / "clean.csv"
    at = page("runs", store_path, monkeypatch, run_name="audited", remediate_out=str(out),
              remediate_act_on=["leaked", "secret"])
    at.button(key="remediate_go").click().run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.success and "every change listed in" in at.success[-1].value
    assert out.is_file() and (tmp_path / "clean.csv.manifest.json").is_file()
    manifest = json.loads((tmp_path / "clean.csv.manifest.json").read_text())
    assert manifest["run"] == "audited" and manifest["act_on"] == ["leaked", "secret"]
    at = page("runs", store_path, monkeypatch, run_name="audited", remediate_out=str(tmp_path / "c.json"))
    at.button(key="remediate_go").click().run()
    assert at.error and "keeps the data's format" in at.error[-1].value  # one line, nothing written
    assert not (tmp_path / "c.json").exists()


def test_compare_page_shows_each_secret_value_before_and_after(store_path, monkeypatch):
    at = page("compare", store_path, monkeypatch, run_name="audited", compare_vs="run")
    assert "Secret values, before and after" in [h.value for h in at.subheader]
