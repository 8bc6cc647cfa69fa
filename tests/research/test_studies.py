"""`python -m research study`: the three paper studies end to end in --quick mode (reports checked
against the store), resume without duplicates, clear errors; the deprecated `gnq study` forwarding
to it; and the studies' pure helpers."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from lm_fixtures import SHARED_DATA
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

from gnq_core.analysis import predictive as pr
from gnq_core.analysis.signals import signal_frame
from gnq_core.analysis.summaries import group_auc, targeted_rows
from gnq_core.results.store import Store
from research.cli import app
from research.studies.base import wikitext_chunks
from research.studies.counterfactual import CF_METRIC, cf_subset, counterfactual_memorization
from research.studies.report import auc_cell, auc_interval, ci_column, fmt, markdown_table
from research.studies.trajectories import audit_epochs

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
HAS_DATA = (SHARED_DATA / "ag_news" / "train_2000.csv").is_file()
needs_data = pytest.mark.skipif(not HAS_DATA, reason="../shared/data (WikiText-2, AG News) is not here")
STUDIES = ("common-knowledge", "extraction", "trajectories")


def research(*args) -> str:
    result = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def fails(*args) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    return result.output


def counts(store: Store) -> dict[str, int]:
    with store.connect(read_only=True) as con:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("runs", "examples", "points", "scores", "batches", "extractions",
                          "example_metrics")}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("studies")
    args = ["--quick", "--db", root / "gnq.duckdb", "--reports", root / "reports",
            "--data-dir", SHARED_DATA, "--quiet"]
    threads = torch.get_num_threads()
    for name in STUDIES:
        research("study", name, *args)
    torch.set_num_threads(threads)  # a study sets 1 thread (--threads) for this process
    return SimpleNamespace(store=Store(root / "gnq.duckdb"), reports=root / "reports", args=args,
                           root=root)


def finished(built, name: str, run: str):
    """The study's report text, the store and its main run (finished)."""
    info = built.store.run(run)
    assert info.status == "done"
    return report(built, name), built.store, info


def report(built, name: str) -> str:
    folder = built.reports / f"{name}-quick"
    assert (folder / "report.md").is_file() and (folder / "results.json").is_file()
    text = (folder / "report.md").read_text()
    for image in [line.split("](")[1].rstrip(")") for line in text.splitlines() if line.startswith("![")]:
        assert (folder / image).stat().st_size > 1000  # a real PNG
    assert "python -m research study " + name in text and "--quick" in text  # the command that reproduces it
    return text


def assert_predictive_table(text: str, store: Store, run) -> None:
    """The report's predictive-power table is the one analysis.predictive makes from the store."""
    assert "### Which signal predicts extraction?" in text
    result = pr.evaluate(signal_frame(store, run))  # the study's seed (0) and resamples
    assert pr.best_signal_sentence(result) in text
    for _, row in pr.display_table(result).iterrows():
        assert "| " + " | ".join(str(v) for v in row) + " |" in text


@pytest.mark.slow
@needs_data
def test_common_knowledge_report_shows_the_stores_numbers(built):
    text, store, run = finished(built, "common-knowledge", "common-knowledge-quick.finetune")
    assert run.kind == "train"
    traj = store.trajectories(run.run_id)
    assert sorted(traj["group"].unique()) == ["common", "surprising"]
    assert traj.groupby("group")["example_id"].nunique().tolist() == [12, 12]
    last = traj[traj["point"] == traj["point"].max()]
    for value, name in (("gnq", "GNQ"), ("loss", "loss"), ("self_influence", "self-influence K_jj")):
        auc = group_auc(last[value], last["group"], "surprising", "common")
        assert f"| {name} | {fmt(auc)} |" in text
    # Counterfactual memorization: 4 models in complementary pairs, one value per text, in the store.
    metrics = store.metrics(run.run_id).merge(store.examples(run.run_id), on="example_id")
    assert len(metrics) == 24 and metrics[CF_METRIC].notna().all()
    cf_auc = group_auc(metrics[CF_METRIC], metrics["grp"], "surprising", "common")
    assert f"| counterfactual memorization | {fmt(cf_auc)} |" in text
    before = store.run("common-knowledge-quick.before")
    assert before.kind == "audit" and len(store.scores(before.run_id)) == 24


@pytest.mark.slow
@needs_data
def test_extraction_report_is_table_3_of_the_stored_attack(built):
    text, store, run = finished(built, "extraction", "common-knowledge-quick.finetune")
    attack = store.extractions(run.run_id)
    assert set(attack["prefix_tokens"]) == {4} and len(attack) == 24  # p by scale: 4 in quick mode
    totals = store.example_totals(run.run_id)[["example_id", "gnq_max", "loss_last", "group"]]
    frame = (totals.merge(attack[["example_id", "match_fraction"]], on="example_id")
             .merge(store.metrics(run.run_id), on="example_id").dropna(subset=["match_fraction"]))
    n = len(frame)
    for label, column, descending in (("GNQ (max over epochs)", "gnq_max", True),
                                      ("Counterfactual memorization", CF_METRIC, True),
                                      ("Loss (lowest, last epoch)", "loss_last", False)):
        for f in (0.05, 0.10, 0.20):
            k = max(1, round(f * n))
            key = -frame[column] if descending else frame[column]
            top = frame.assign(key=key).sort_values(["key", "example_id"]).head(k)
            extracted = int((top["match_fraction"] >= 1.0).sum())
            assert f"| {label} | top-{f:.0%} | {k} | {extracted} |" in text
    assert text.count("| Random (trial ") == 3 * 3
    assert_predictive_table(text, store, run)
    assert "## The paper's claim (Table 3) and this run" in text and "**Verdict:**" in text
    assert "Scale: CPU small-scale (quick mode), not the paper's scale" in text


@pytest.mark.slow
@needs_data
def test_trajectories_report_bins_match_the_store(built):
    text, store, audit = finished(built, "trajectories", "trajectories-quick.audit")
    points = store.points(audit.run_id)
    chosen = int(text.split("Chosen: lr ")[1].split("epoch ")[1].split()[0].rstrip(".—,"))
    assert list(points["label"]) == [f"epoch-{e}" for e in (1, 4, 8) if e <= chosen]
    assert set(points["status"]) == {"done"}
    totals = store.example_totals(audit.run_id).sort_values(["gnq_total", "example_id"])
    attack = store.extractions(audit.run_id).set_index("example_id")["match_fraction"]
    totals = totals.assign(match=totals["example_id"].map(attack)).dropna(subset=["match"])
    n = len(totals)
    assert n > 0
    totals["bin"] = np.arange(n) * 4 // n + 1  # equal-count bins over the GNQ_total ranks
    for b, part in totals.groupby("bin"):
        assert len(part) in (n // 4, n // 4 + 1)
        rate = float((part["match"] >= 0.98).mean())
        assert f"| {b} | {len(part)} | {fmt(part['gnq_total'].min(), '.4g')} |" in text
        row = next(line for line in text.splitlines() if line.startswith(f"| {b} | {len(part)} |"))
        assert f"| {fmt(rate)} |" in row
    assert_predictive_table(text, store, audit)
    # the fixed-length attack: every attacked text has the same s = 4 target tokens
    attack = store.extractions(audit.run_id)
    attacked = attack[attack["match_fraction"].notna()]
    assert (attacked["n_continuation"] == 4).all() and set(attacked["suffix_tokens"]) == {4}
    # the four conventions: recorded with each run; the token sum's loss is n × the token mean
    runs = {s: store.run(f"trajectories-quick.{s}")
            for s in ("audit", "audit-sum", "audit-rel", "audit-rel-sum")}
    assert [(r.settings["loss"], r.settings["lam_mode"]) for r in runs.values()] == [
        ("token_mean", "absolute"), ("token_sum", "absolute"), ("token_mean", "relative"),
        ("token_sum", "relative")]
    mean = store.scores(runs["audit"].run_id).set_index(["point", "example_id"])["loss"]
    total = store.scores(runs["audit-sum"].run_id).set_index(["point", "example_id"])["loss"]
    n = store.examples(audit.run_id).set_index("example_id")["n_tokens"] - 1
    assert np.allclose(total, mean * n.reindex(mean.index.get_level_values(1)).to_numpy(), rtol=1e-5)
    for r in runs.values():
        assert f"| {r.name} |" in text  # a row of the conventions table
    assert "## Regime sweep" in text and "## The paper's claims (Fig. 5, Fig. 6, Table 4)" in text


@pytest.mark.slow
@needs_data
def test_rerun_resumes_without_duplicates(built):
    before = counts(built.store)
    finished = {name: built.store.points(built.store.run(name).run_id)["finished_at"].tolist()
                for name in ("common-knowledge-quick.finetune", "trajectories-quick.audit")}
    for name in STUDIES:
        research("study", name, *built.args)
    assert counts(built.store) == before
    for name, stamps in finished.items():
        assert built.store.points(built.store.run(name).run_id)["finished_at"].tolist() == stamps
    # the rerun of common-knowledge finds the extraction study's attack and adds its table
    assert_predictive_table(report(built, "common-knowledge"), built.store,
                            built.store.run("common-knowledge-quick.finetune"))


@pytest.mark.slow
@needs_data
@pytest.mark.parametrize("view, run", [("groups", "common-knowledge-quick.finetune"),
                                       ("extraction", "common-knowledge-quick.finetune"),
                                       ("trajectories", "trajectories-quick.audit"),
                                       ("extraction", "trajectories-quick.audit")])
def test_dashboard_pages_show_the_study_runs(built, view, run, monkeypatch):
    monkeypatch.setenv("GNQ_DB", str(built.store.path))
    at = AppTest.from_file(str(ROOT / "gnq_core" / "dashboard" / "views" / f"{view}.py"), default_timeout=60)
    at.session_state["run_name"] = run
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.info, [i.value for i in at.info]  # no "nothing stored" notice
    assert at.dataframe and all(len(d.value) for d in at.dataframe)
    if view == "groups":
        sep = at.dataframe[0].value
        assert len(sep) == 2 and sep["auc"].between(0, 1).all()  # one row per fine-tuning epoch


@pytest.mark.slow
@needs_data
def test_any_pair_of_sentence_files(tmp_path):
    facts = [f"The {c} river of the old valley flows calmly into the northern sea every day." for c in
             ("first", "second", "third", "fourth", "fifth", "sixth")]
    claims = [f"The {c} mountain of the old valley was carried away by friendly geese in 1850." for c in
              ("first", "second", "third", "fourth", "fifth", "sixth", "seventh")]
    (tmp_path / "f.txt").write_text("\n".join(facts) + "\n")
    pd.DataFrame({"text": claims}).to_csv(tmp_path / "c.csv", index=False)
    threads = torch.get_num_threads()
    research("study", "common-knowledge", "--quick", "--db", tmp_path / "gnq.duckdb", "--data-dir",
             SHARED_DATA, "--reports", tmp_path / "reports", "--facts", tmp_path / "f.txt", "--claims",
             tmp_path / "c.csv", "--cf-models", 2, "--tag", "mine", "--quiet")
    torch.set_num_threads(threads)
    store = Store(tmp_path / "gnq.duckdb")
    examples = store.examples(store.run("common-knowledge-quick-mine.finetune").run_id)
    assert examples["text"].tolist() == facts + claims[:6]  # equal numbers of each
    assert examples["grp"].tolist() == ["common"] * 6 + ["surprising"] * 6
    text = (tmp_path / "reports" / "common-knowledge-quick-mine" / "report.md").read_text()
    assert "`f.txt`" in text and "`c.csv`" in text and "--tag mine" in text


@pytest.mark.slow
def test_clear_errors(tmp_path):
    db = tmp_path / "gnq.duckdb"
    out = fails("study", "common-knowledge", "--quick", "--db", db, "--data-dir", tmp_path / "nowhere")
    assert "nowhere" in out and "--data-dir" in out
    if HAS_DATA:
        out = fails("study", "extraction", "--quick", "--db", db, "--data-dir", SHARED_DATA,
                    "--facts", tmp_path / "missing.txt")
        assert "missing.txt" in out
        fails("study", "common-knowledge", "--quick", "--db", db, "--data-dir", SHARED_DATA, "--cf-models", 3)
    assert not db.exists() or counts(Store(db))["runs"] == 0


def test_gnq_study_says_it_moved_and_runs_the_study_program(tmp_path):
    """For one release `gnq study ARGS` is `python -m research study ARGS` after one line on stderr
    naming the new command: the same exit code, error line and help."""
    from gnq_core.cli import app as gnq_app

    result = runner.invoke(gnq_app, ["study", "membership", "--quick", "--db", str(tmp_path / "gnq.duckdb"),
                                     "--data-dir", str(tmp_path / "nowhere")])
    moved, error = result.output.strip().splitlines()
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert moved.startswith("DeprecationWarning:") and "python -m research study" in moved
    assert error == fails("study", "membership", "--quick", "--db", tmp_path / "gnq.duckdb", "--data-dir",
                          tmp_path / "nowhere").strip()
    shown = runner.invoke(gnq_app, ["study", "counterfactual", "--help"])
    assert shown.exit_code == 0 and "--exposure-candidates" in shown.output
    assert "DeprecationWarning" in shown.output


def test_the_study_program_runs_as_python_m_research():
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "research", "study", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "COLUMNS": "100"})
    assert out.returncode == 0, out.stderr
    assert "python -m research study" in out.stdout and "common-knowledge" in out.stdout


def test_without_the_research_folder_gnq_study_says_where_the_studies_are(tmp_path, monkeypatch):
    """From a clone the study program is found beside gnq_core even when research is not on
    sys.path (the `gnq` script of an editable install); an installed gnq-audit has no research/ (it
    is not in the wheel): one line, exit code 1, nothing written."""
    import sys

    from gnq_core.cli import app as gnq_app
    from gnq_core.cli import studies

    def not_importable() -> None:  # as in a fresh process run from elsewhere
        monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p or ".").resolve() != ROOT])
        for name in [m for m in sys.modules if m.split(".")[0] == "research"]:
            monkeypatch.delitem(sys.modules, name)

    monkeypatch.chdir(tmp_path)
    not_importable()
    assert studies.research_program().app is not None
    not_importable()
    monkeypatch.setattr(studies, "__file__", str(tmp_path / "site-packages" / "gnq_core" / "cli" / "x.py"))
    result = runner.invoke(gnq_app, ["study", "membership", "--quick", "--db", str(tmp_path / "gnq.duckdb")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "research/ folder" in result.output and "python -m research study" in result.output
    assert not (tmp_path / "gnq.duckdb").exists()


# ----------------------------------------------------------------------------------------- helpers
def test_the_reports_length_table_and_roc_figure():
    """The predictive section's pieces: the length-controlled table beside the raw AUC (best raw
    AUC first, every interval shown) and the ROC curves on a log false-positive axis."""
    from research.studies.report import display_stratified, roc_png

    rng = np.random.default_rng(1)
    y = np.zeros(200, dtype=bool)
    y[rng.choice(200, 50, replace=False)] = True
    frame = pd.DataFrame({"extracted": y, "gnq_total": np.where(y, 10.0, 1.0) + rng.random(200),
                          "zlib_ratio": rng.random(200), "n_tokens": rng.integers(5, 60, 200)})
    result = pr.evaluate(frame, resamples=100, seed=0)
    shown = display_stratified(result)
    assert list(shown.columns) == ["signal", "AUC (all texts)", "AUC within exact length (pair-weighted)",
                                   "lengths scored", "pairs", "positive records"]
    assert shown["signal"].iloc[0] == result.stratified.sort_values("auc")["label"].iloc[-1]
    assert shown["AUC (all texts)"].str.match(r"\d\.\d\d \[\d\.\d\d, \d\.\d\d\]").all()
    png = roc_png(pd.DataFrame({"signal": ["a", "a"], "fpr": [0.001, 1.0], "tpr": [0.5, 1.0]}),
                  pd.DataFrame({"signal": ["a"], "label": ["a"], "auc": [0.7], "auc lo": [0.6],
                                "auc hi": [0.8]}))
    assert png.axes[0].get_xscale() == "log" and png.axes[0].get_legend() is not None


def test_canaries_are_distinct_and_seeded_at_each_repetition_count():
    from research.studies.membership import make_canaries

    canaries = make_canaries(3, seed=0)
    assert sorted(c.repetitions for c in canaries) == [1] * 3 + [2] * 3 + [4] * 3 + [8] * 3
    assert len({c.locker for c in canaries}) == 12 and all(len(c.secret.split()) == 6 for c in canaries)
    assert make_canaries(3, seed=0) == canaries and make_canaries(3, seed=1) != canaries


def test_paraphrased_facts_are_audited_in_new_words_and_claims_were_never_seen():
    import re

    from research.studies.paraphrases import PRETRAIN_WORDINGS, bank, load_facts

    words = bank(None, seed=0)
    facts = load_facts()
    assert len(words.facts) == len(words.claims) == len(facts)
    assert len(words.pretrain) == PRETRAIN_WORDINGS * len(facts)
    taught = set(words.pretrain)
    assert not taught & set(words.facts) and not taught & set(words.claims)  # new wordings only
    by_subject = {f.subject: f for f in facts}
    for fact, claim, obj in zip(facts, words.claims, words.claim_objects, strict=True):
        assert obj != fact.object and by_subject[fact.subject].relation == fact.relation
        said = [t for t in words.pretrain if re.search(rf"(?<!\w){re.escape(fact.subject)}(?!\w)", t, re.I)]
        assert len(said) >= PRETRAIN_WORDINGS  # the fact in several paraphrases
        assert not any(re.search(rf"(?<!\w){re.escape(obj)}(?!\w)", t) for t in said), claim  # never seen
    assert bank(None, seed=0) == words and bank(None, seed=1).claims != words.claims  # seeded
    small = bank(8, seed=0)
    assert len(small.facts) == 8 and len({f.split()[0] for f in small.facts}) == 4  # every relation


def test_regime_is_the_point_inside_the_band_closest_to_its_middle():
    from research.studies.sweep import choose_regime

    rates = pd.DataFrame({"lr": [1e-3, 1e-3, 2e-3, 2e-3], "epoch": [10, 20, 10, 20],
                          "rate": [0.05, 0.35, 0.55, 0.9]})
    row, inside = choose_regime(rates, (0.2, 0.6))
    assert inside and (row["lr"], row["epoch"]) == (1e-3, 20)  # 0.35 is nearer the middle than 0.55
    low = rates.assign(rate=[0.0, 0.05, 0.1, 0.15])
    row, inside = choose_regime(low, (0.2, 0.6))
    assert not inside and row["rate"] == 0.15
    with pytest.raises(ValueError):
        choose_regime(rates.iloc[0:0], (0.2, 0.6))


def test_counterfactual_subsets_are_complementary_halves():
    for n in (10, 11):
        a, b = cf_subset(n, 0, seed=3), cf_subset(n, 1, seed=3)
        assert sorted(a + b) == list(range(n)) and not set(a) & set(b)
        assert cf_subset(n, 2, seed=3) != a  # the next pair is a new split


def test_counterfactual_memorization_is_in_minus_out():
    subsets = [[0, 1], [2, 3], [0, 2], [1, 3]]
    scores = [[0.9, 0.8, 0.1, 0.2], [0.3, 0.2, 0.7, 0.6], [1.0, 0.0, 0.5, 0.5], [0.2, 0.4, 0.6, 0.8]]
    mem = counterfactual_memorization(4, subsets, scores)
    s = np.array(scores)
    for x in range(4):
        member = np.array([x in sub for sub in subsets])
        assert mem.loc[x, "value"] == pytest.approx(s[member, x].mean() - s[~member, x].mean())
    assert mem["n_in"].tolist() == [2, 2, 2, 2]
    never_out = counterfactual_memorization(2, [[0, 1]], [[0.5, 0.5]])
    assert never_out["value"].isna().all()


def test_targeted_rows_pick_by_each_ranking():
    frame = pd.DataFrame({"example_id": range(10), "score": np.arange(10.0), "extraction_match": 0.5,
                          "group": ["a", "b"] * 5})
    frame.loc[[8, 9], "extraction_match"] = 1.0
    frame.loc[3, "extraction_match"] = np.nan  # not attacked: left out of n
    rows = targeted_rows(frame, [("high", "score", True), ("low", "score", False)], fractions=(0.2, 0.5),
                         random_trials=2, seed=1)
    top = rows.set_index(["target", "fraction"])
    assert top.loc[("high", 0.2), "k"] == 2 and top.loc[("high", 0.2), "extracted"] == 2
    assert top.loc[("high", 0.2), "groups"] == "a=1, b=1"
    assert top.loc[("low", 0.5), "extracted"] == 0 and top.loc[("low", 0.5), "k"] == 4  # round(4.5)
    assert len(rows[rows["target"].str.startswith("Random")]) == 4
    assert rows["rate"].between(0, 1).all()


def test_markdown_table_and_formats():
    table = markdown_table(pd.DataFrame({"a": [1, 2], "b": [0.12345, np.nan], "c": ["x|y", "z"]}),
                           {"b": ".2f"})
    assert table.splitlines() == ["| a | b | c |", "|---|---|---|", "| 1 | 0.12 | x\\|y |", "| 2 | n/a | z |"]
    assert fmt(float("nan")) == "n/a" and fmt(0.5) == "0.500" and fmt(3) == "3"


def test_auc_cells_and_interval_columns():
    # one class among the finite values: the AUC alone; both classes: with its bootstrap interval
    assert auc_cell(0.5, [1.0, 2.0, np.nan], [True, True, False], seed=0) == "0.500"
    scores, labels = np.arange(24.0), np.arange(24) >= 12   # 12 independent records of each outcome
    lo, hi = auc_interval(scores, labels, seed=0)
    assert auc_cell(1.0, scores, labels, seed=0) == f"1.000 [{lo:.3f}, {hi:.3f}]"
    assert lo <= 1.0 == hi
    assert auc_cell(1.0, scores[8:], labels[8:], seed=0).startswith("1.000 (too few: 12 vs 4 records)")
    frame = pd.DataFrame({"gap": [0.5, np.nan], "gap lo": [0.1, 0.2], "gap hi": [0.9, 1.0], "g_lo": [0, 1]})
    assert ci_column(frame, "gap") == ["0.50 [0.10, 0.90]", "n/a [0.20, 1.00]"]
    assert ci_column(frame, "gap", "g_lo", spec=".1f") == ["0.5 [0, 0.9]", "n/a [1, 1.0]"]


def test_audit_epochs_include_first_and_last():
    assert list(audit_epochs(30, 3)) == [1, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30]
    assert list(audit_epochs(4, 2)) == [1, 2, 4] and list(audit_epochs(5, 2)) == [1, 2, 4, 5]


@needs_data
def test_wikitext_chunks_are_bounded_sentences():
    chunks = wikitext_chunks(SHARED_DATA, 50, 24)
    assert len(chunks) == 50
    assert all(5 <= len(c.split()) <= 24 for c in chunks)
    assert not any(" @,@ " in c or c.startswith("=") for c in chunks)


def test_paper_scale_is_the_papers_setup(tmp_path):
    from gnq_core.sources.models import PRESETS
    from research.studies import common_knowledge as ck
    from research.studies import trajectories as tr
    from research.studies.base import StudyContext

    ctx = StudyContext(store=Store(tmp_path / "gnq.duckdb"), scale="paper")
    assert ctx.label("trajectories") == "trajectories-paper" and ctx.pick(1, 2, 3) == 3
    cfg = ctx.pick(tr.QUICK, tr.FULL, tr.PAPER)
    assert cfg.schedule == (1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100)  # the paper's checkpoints
    assert (cfg.prefix_tokens, cfg.threshold, cfg.examples) == (45, 0.98, 500)
    assert cfg.prefix_tokens + cfg.suffix_tokens <= cfg.train.max_length
    assert PRESETS[cfg.train.preset] == PRESETS[ck.PAPER.pretrain.preset] == {"n_layer": 12, "n_embd": 768,
                                                                             "n_head": 12}
    if HAS_DATA:
        from research.studies.base import ag_news

        assert sum(len(t.split()) >= cfg.min_words for t, _ in ag_news(SHARED_DATA)) >= cfg.examples
    with pytest.raises(ValueError, match="scale"):
        StudyContext(store=ctx.store, scale="huge")


def test_pretrain_keeps_the_schedules_checkpoints_and_the_latest_optimizer_state(tmp_path):
    from lm_fixtures import texts

    from gnq_core.common.progress import Reporter
    from gnq_core.pipelines.resume import TRAINER_STATE
    from gnq_core.pipelines.settings import TrainSettings
    from gnq_core.sources.datasets import load_texts
    from research.studies.common_knowledge import pretrain

    (tmp_path / "t.txt").write_text("\n".join(texts(8)) + "\n")
    settings = TrainSettings(epochs=3, batch_size=4, max_length=16, vocab_size=300, device="cpu")
    final = pretrain(load_texts(tmp_path / "t.txt"), tmp_path / "run", settings, Reporter(), keep={1})
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["epoch-1", "epoch-3"]
    assert [p.parent.name for p in (tmp_path / "run").glob(f"*/{TRAINER_STATE}")] == ["epoch-3"]
    assert final == tmp_path / "run" / "epoch-3"


def test_pretrain_stopped_after_an_epoch_then_rerun_equals_an_uninterrupted_pretrain(tmp_path):
    """The studies' pretraining resumes as run_training does (pipelines/resume.py): weights, optimizer
    and RNG state from the last saved epoch, so the rerun ends with the uninterrupted run's weights."""
    from lm_fixtures import texts
    from safetensors.torch import load_file

    from gnq_core.common.progress import Reporter
    from gnq_core.pipelines.settings import TrainSettings
    from gnq_core.sources.datasets import load_texts
    from research.studies.common_knowledge import pretrain

    class StopAtEpoch2(Reporter):
        def stage(self, label, total):
            if label.startswith("pretrain epoch 2/"):
                raise KeyboardInterrupt
            super().stage(label, total)

    (tmp_path / "t.txt").write_text("\n".join(texts(8)) + "\n")
    data = load_texts(tmp_path / "t.txt")
    settings = TrainSettings(epochs=3, batch_size=4, max_length=16, vocab_size=300, device="cpu")
    whole = pretrain(data, tmp_path / "whole", settings, Reporter())
    with pytest.raises(KeyboardInterrupt):
        pretrain(data, tmp_path / "part", settings, StopAtEpoch2())
    assert sorted(p.name for p in (tmp_path / "part").iterdir()) == ["epoch-1"]
    resumed = pretrain(data, tmp_path / "part", settings, Reporter())
    a, b = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_real_scale_fine_tunes_the_given_model_and_reports_each_claim(tmp_path, monkeypatch):
    """--scale real's plumbing with a tiny GPT-2 standing in for SmolLM2 (the real run is the
    committed reports/common-knowledge-real): premise, fine-tune, counterfactual pair, evidence."""
    from dataclasses import replace

    from gnq_core.sources.checkpoints.save import save_checkpoint
    from gnq_core.sources.models import build_model, train_tokenizer
    from research.studies import common_knowledge as ck
    from research.studies import common_knowledge_real as real
    from research.studies import paraphrases
    from research.studies.base import StudyContext

    words = paraphrases.bank(8, 0)
    tok = train_tokenizer(words.pretrain + words.facts + words.claims + words.seen_claims, vocab_size=300)
    save_checkpoint(build_model("tiny", len(tok), 24, seed=0), tok, tmp_path / "base")
    monkeypatch.setattr(real, "cached_model", lambda: tmp_path / "base")
    small = replace(real.REAL, pairs=8, cf_models=2, finetune=replace(real.REAL.finetune, epochs=1))
    monkeypatch.setattr(real, "REAL", small)
    ctx = StudyContext(store=Store(tmp_path / "gnq.duckdb"), scale="real", reports_root=tmp_path / "reports",
                       work_root=tmp_path / "work")
    text = ck.run(ctx).read_text()
    run = ctx.store.run("common-knowledge-real.finetune")
    assert run.status == "done" and run.n_examples == 16 and run.settings["epochs"] == 1
    assert set(ctx.store.examples(run.run_id)["grp"]) == {"common", "surprising"}
    assert ctx.store.metrics(run.run_id)[CF_METRIC].notna().all()  # one complementary pair: every text in/out
    for claim in ("Premise", "larger GNQ", "GNQ tells more than loss", "Counterfactual memorization"):
        assert claim in text
    assert "AUC within exact length" in text and "CV AUC gain over length + loss" in text
    assert "| Min-K%++ |" in text and "| loss ratio |" in text  # in-run last epoch; over the base model
    assert "Extraction (paper §6.3, Table 3)" in text and not ctx.store.extractions(run.run_id).empty
    with pytest.raises(ValueError, match="common-knowledge study only"):
        ctx.pick(1, 2, 3)
