"""`gnq report`: one self-contained HTML file from a store (built here through the Store API, no
model needed), hostile texts escaped, the in-run GNQ of the training run found, bad input refused."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_e2e_browser import browser  # noqa: F401 (the headless Chromium fixture)
from typer.testing import CliRunner

from gnq_core.analysis.signals import signal_frame
from gnq_core.cli import app
from gnq_core.results.records import RunSpec, ScoreColumns, batch_results
from gnq_core.results.store import Store

runner = CliRunner()
HOSTILE = "<script>alert('x')</script><img src=x onerror=alert(1)> & \"quotes\""
N = 60


def _examples() -> pd.DataFrame:
    texts = [f"text number {i} " + "word " * (i % 7) for i in range(N)]
    texts[3] = HOSTILE
    return pd.DataFrame({"example_id": range(N), "text": texts, "grp": None,
                         "n_tokens": [5 + i % 7 for i in range(N)]})


def _run(store: Store, name: str, kind: str):
    return store.create_run(RunSpec(name=name, kind=kind, lam=0.01, batch_size=4, seed=0, max_length=16,
                                    model_path=f"/models/{name}", dataset_path="d.csv", dataset_hash="h",
                                    n_examples=N, code_version="test", device="cpu", dtype="float64"),
                            _examples())


def _points(store: Store, run_id: int, gnq: np.ndarray, hashes: list[str]) -> None:
    for point, model_hash in enumerate(hashes):
        store.add_points(run_id, [{"point": point, "label": f"epoch-{point + 1}", "kind": "epoch",
                                   "model_hash": model_hash}])
        loss = 3.0 - gnq / gnq.max()
        parts = [batch_results(range(b, b + 4), loss[b: b + 4], gnq[b: b + 4] * (point + 1), [1.0] * 4,
                               batch_index=b // 4, step=None, condition=2.0, finite=True, seconds=0.1)
                 for b in range(0, N, 4)]
        texts = ScoreColumns.joined([p[0] for p in parts])
        store.write_point(run_id, point, texts, [p[1] for p in parts], 0.1, model_hash=model_hash)


@pytest.fixture
def db(tmp_path) -> Path:
    """An in-run training run and a post-hoc audit of the same checkpoints (same weights hashes);
    the audit is attacked: the texts with the highest GNQ are the extracted ones, mostly."""
    store = Store(tmp_path / "gnq.duckdb")
    rng = np.random.default_rng(0)
    gnq = rng.uniform(1, 50, N)
    gnq[3] = 100.0  # the hostile text tops the list: in the verdict table and in full
    train = _run(store, "trained", "train")
    _points(store, train.run_id, gnq[::-1].copy(), ["h1", "h2"])
    audit = _run(store, "audited", "audit")
    _points(store, audit.run_id, gnq, ["h1", "h2"])
    extracted = gnq > np.quantile(gnq, 0.7)
    store.write_extractions(audit.run_id, 1, 4, pd.DataFrame({
        "example_id": range(N), "threshold": 1.0, "n_continuation": 4,
        "match_fraction": np.where(extracted, 1.0, 0.25), "success": extracted, "prefix_text": "p",
        "generated_text": [HOSTILE if i == 3 else "gen" for i in range(N)], "target_text": "t",
        "target_tokens": None, "generated_tokens": None}), code_version="test")
    return store.path


class _Scripts(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[dict[str, str | None]] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "script":
            self.scripts.append(dict(attrs))


def test_report_is_one_self_contained_html_file(db, tmp_path):
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["report", "--run", "audited", "--out", str(out), "--db", str(db),
                                 "--resamples", "50"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    text = out.read_text(encoding="utf-8")
    parser = _Scripts()
    parser.feed(text)
    parser.close()
    assert parser.scripts, "plotly's script is inlined"
    assert not any((s.get("src") or "").startswith(("http:", "https:", "//")) for s in parser.scripts)
    assert "<link" not in text  # no stylesheet from elsewhere either
    assert "Plotly.newPlot" in text and "plotly.js" in text
    # the hostile text is shown escaped, never as markup
    assert HOSTILE not in text and "<img src=x" not in text
    assert text.count("&lt;script&gt;alert(") >= 3  # table, text in full, continuation
    assert parser.tags.count("img") == 0
    for heading in ("Provenance", "Verdict", "Which signal predicts extraction?", "flagged texts in full"):
        assert heading in text
    assert "the combined verdict (rank 1 = look first)" in text  # the report follows the verdict order
    assert "GNQ in-run (accumulated)" in text and "trained" in text  # found through the weights hashes
    assert "AUC" in text and "50 bootstrap resamples of copy clusters" in text
    assert "Unit: records (copies collapsed to one record)" in text


def test_a_run_without_attack_or_points_still_reports(db, tmp_path):
    from gnq_core.analysis.html_report import build_report

    store = Store(db)
    text = build_report(store, store.run("trained"), resamples=20)
    assert "No extraction attack is stored for this run" in text and "Provenance" in text
    # no reference model, no ground truth: the ranking is said to be loss-only and uncalibrated
    assert "Memorisation risk: loss-only, uncalibrated.</b>" in text and "no reference model" in text
    hostile = _run(store, "<i>run</i>", "audit")  # a name is user data too
    text = build_report(store, hostile, resamples=20)
    assert "<i>run</i>" not in text and "&lt;i&gt;run&lt;/i&gt;" in text
    assert "0 of 0" in text  # no finished point


def test_report_picks_up_a_verdict_order(db):
    from gnq_core.analysis.html_report import ordered

    frame = signal_frame(Store(db), Store(db).run("audited"))
    frame = frame.assign(verdict_score=0.0, rank=N - frame["example_id"])
    first, name = ordered(frame)
    assert first["example_id"].iloc[0] == N - 1 and "combined verdict" in name


def test_in_run_gnq_of_the_training_run_joins_the_audit(db):
    store = Store(db)
    frame = signal_frame(store, store.run("audited"))
    trained = store.example_totals(store.run("trained").run_id).set_index("example_id")["gnq_total"]
    assert np.allclose(frame.set_index("example_id")["gnq_inrun_total"].sort_index(), trained.sort_index())
    assert "gnq_inrun_total" not in signal_frame(store, store.run("trained")).columns


def test_report_bad_input_is_one_line(db, tmp_path):
    def fails(*args) -> str:
        result = runner.invoke(app, ["report", *map(str, args)])
        assert result.exit_code == 1, result.output
        assert "Traceback" not in result.output and len(result.output.strip().splitlines()) <= 2
        return result.output

    assert "no run 'nope'" in fails("--run", "nope", "--out", tmp_path / "r.html", "--db", db)
    assert "does not exist" in fails("--run", "audited", "--out", tmp_path / "no" / "r.html", "--db", db)
    assert "is a folder" in fails("--run", "audited", "--out", tmp_path, "--db", db)
    assert "no store here" in fails("--run", "audited", "--out", tmp_path / "r.html",
                                    "--db", tmp_path / "missing.duckdb")
    if Path("/proc/self").is_dir():  # a folder nobody can create files in, not even root
        assert "cannot write" in fails("--run", "audited", "--out", "/proc/gnq-report.html", "--db", db)
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "missing.duckdb").exists()


@pytest.mark.slow
def test_report_opens_offline_in_a_real_browser(db, tmp_path, browser):  # noqa: F811 (the fixture)
    """Headless Chromium, network off: the ROC chart draws from the inlined plotly.js, nothing is
    requested from anywhere, and the hostile text is shown as text (no alert fires)."""
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["report", "--run", "audited", "--out", str(out), "--db", str(db),
                                 "--resamples", "50"])
    assert result.exit_code == 0, result.output
    context = browser.new_context(offline=True)
    page = context.new_page()
    requests, dialogs, errors = [], [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(out.as_uri())
        page.wait_for_selector(".js-plotly-plot .main-svg", timeout=60_000)
        legend = page.text_content(".js-plotly-plot .legend") or ""
        body = page.inner_text("body")
    finally:
        context.close()
    assert "GNQ_total" in legend and "chance" in legend
    assert "<script>alert('x')</script>" in body  # shown, not run
    assert not dialogs and not errors, (dialogs, errors)
    assert all(u.startswith(("file:", "data:", "blob:", "about:")) for u in requests), requests


# ------------------------------------------------------- what the measurements tell a user
def test_report_json_holds_every_table_with_provenance(db, tmp_path):
    """`gnq report --json`: schema gnq-report/2; per outcome × signal the three scopes; the numbers
    equal analysis.predictive's on the same frame; provenance names what produced the run."""
    import json

    from gnq_core.analysis import predictive as pr

    out = tmp_path / "tables.json"
    result = runner.invoke(app, ["report", "--run", "audited", "--json", str(out), "--db", str(db),
                                 "--resamples", "50"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["schema"] == "gnq-report/2" and doc["run"]["name"] == "audited"
    prov = doc["provenance"]
    for key in ("λ", "loss convention", "batch size", "seed", "model", "model hash", "dataset hash",
                "code version", "attack", "signals read at"):
        assert key in prov, key
    assert prov["λ"] == 0.01 and "reveal 4 tokens" in prov["attack"]
    assert doc["method"]["fpr_levels"] == [0.001, 0.01, 0.1]
    rows = [r for r in doc["tables"] if r["outcome"] == "extraction" and r["unit"] == "texts"]
    assert {r["unit"] for r in doc["tables"]} == {"texts", "records"}
    for r in doc["tables"]:  # every row: its unit, the independent positives, whether too few
        assert isinstance(r["independent_positives"], int) and isinstance(r["too_few"], bool)
    by = {(r["signal"], r["scope"]): r for r in rows}
    assert {s for _, s in by} == {"all", "exact length", "over length + loss"}
    gnq_all = by[("gnq_total", "all")]
    frame = signal_frame(Store(db), Store(db).run("audited")).dropna(subset=["extracted"])
    y = frame["extracted"].astype(bool).to_numpy()
    auc = pr.metrics_matrix(frame["gnq_total"].to_numpy(), y)["auc"][0]
    assert gnq_all["auc"]["value"] == pytest.approx(auc)
    assert set(gnq_all["tpr_at_fpr"]) == {"0.001", "0.01", "0.1"}
    assert gnq_all["auc"]["lo"] <= gnq_all["auc"]["value"] <= gnq_all["auc"]["hi"]
    length = by[("gnq_total", "exact length")]
    assert isinstance(length["strata"], int) and length["strata"] >= 1 and length["pairs"] > 0
    assert by[("n_tokens", "exact length")]["auc"]["value"] == pytest.approx(0.5)  # length-only: 0.5
    gain = by[("gnq_total", "over length + loss")]
    assert gain["base"] == "length spline + loss + log copies" and gain["cv_auc_gain"]["value"] is not None
    assert 0 <= gain["lr_p"] <= 1
    assert doc["verdict"]["risk_basis"]  # which components the risk uses, in words
    # here the extracted texts are those with the highest GNQ: the run's own outcome validates GNQ,
    # so it enters risk, as it is
    assert doc["verdict"]["risk_label"] == "validated on extraction"
    assert doc["verdict"]["risk_ground_truth"] == "extraction" and "gnq" in doc["verdict"]["risk_components"]
    nature = doc["gnq_on_this_run"]
    assert "gradient" in nature["sentence"] and nature["n"] == 2 * N


def test_signals_are_read_at_the_attacked_point(db):
    """An attack on an earlier point reads GNQ, loss and K_jj there, not at the last point."""
    store = Store(db)
    audit = store.run("audited")
    store.delete_extractions(audit.run_id, 1, 4)
    store.write_extractions(audit.run_id, 0, 4, pd.DataFrame({
        "example_id": range(N), "threshold": 1.0, "n_continuation": 4, "match_fraction": 1.0,
        "success": np.arange(N) % 2 == 0, "prefix_text": "p", "generated_text": "g", "target_text": "t",
        "target_tokens": None, "generated_tokens": None}), code_version="test")
    frame = signal_frame(store, audit).set_index("example_id").sort_index()
    first = store.scores(audit.run_id, 0).set_index("example_id").sort_index()
    assert np.allclose(frame["gnq_total"], first["gnq"]) and np.allclose(frame["gnq_last"], first["gnq"])
    assert np.allclose(frame["loss_last"], first["loss"]) and (frame["n_points"] == 1).all()
    assert (frame["signals_point"] == "epoch-1").all()


def test_report_shows_membership_when_the_frame_has_non_members(db):
    """The frame contract's ``member`` column (non-members joined by analysis.evidence) reaches the
    HTML report as its own table and a log-FPR ROC."""
    from gnq_core.analysis import evidence as ev
    from gnq_core.analysis import run_report
    from gnq_core.analysis.html_report import build_report

    store = Store(db)
    run = store.run("audited")
    data = run_report.build(store, run, resamples=20, cv=False)
    others = data.frame.assign(loss_last=data.frame["loss_last"] + 1.0)  # the model never saw them
    data.frame = ev.with_non_members(data.frame, others)
    data.evidence = ev.evidence_table(data.frame, resamples=20, cv=False)
    assert "membership" in set(data.evidence["outcome"])
    text = build_report(store, run, data=data)
    assert "Which signal tells members from non-members?" in text and "non-member texts flagged" in text
    assert any(t["outcome"] == "membership" for t in data.to_json()["tables"])
