"""`python -m research study counterfactual --quick`: counterfactual memorisation on half-trained
tiny models (a record repeated 8× is memorised more than a unique one), the report and results.json with
command, machine, time and seeds; the partial rank correlation's interval for a noise signal
covers 0; the CV gain's base can hold K_jj."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
from typer.testing import CliRunner

from gnq_core.analysis import clusters as cl
from gnq_core.analysis import length_control as lc
from gnq_core.analysis.partial import partial_rank_correlation
from research.cli import app
from research.studies import counterfactual_study as cs


def test_quick_study_counterfactual_memorisation_grows_with_copies(tmp_path):
    args = ["study", "counterfactual", "--quick", "--quiet", "--seeds", "0,1",
            "--db", str(tmp_path / "s.duckdb"), "--reports", str(tmp_path / "reports"),
            "--work", str(tmp_path / "work")]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    folder = tmp_path / "reports" / "counterfactual-quick"
    doc = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    assert doc["seeds"] == [0, 1] and "python -m research study counterfactual" in doc["command"]
    assert "--seeds 0,1" in doc["command"]
    assert doc["machine"] and doc["compute_seconds"] > 0 and doc["cost"]["estimated_hours_k16"] > 0
    text = (folder / "report.md").read_text(encoding="utf-8")
    assert text.splitlines()[2].startswith("**Too few**")  # 2 seeds: the rule needs 3 and 50 positives
    for seed in (0, 1):
        f = pd.read_csv(tmp_path / "work" / "counterfactual-quick" / f"seed-{seed}" / "records.csv")
        planted = f[f["kind"] == "planted"].groupby("copies")[cs.CF].mean()
        assert planted[8] > planted[1] and planted[8] > f.loc[f["kind"] == "base", cs.CF].mean()
        exposure = f.groupby("kind")[cs.EXPOSURE].apply(lambda v: v.notna().mean())
        assert exposure["planted"] == 1 and exposure["base"] == 0  # every planted value, nothing else
        assert np.isfinite(f[["gnq", "k_jj", "loss", "min_k_plus", "zlib_ratio", "gnq_in_run", "k_jj_in_run",
                              "gnq_all", "risk_default"]].to_numpy()).all()
    signals = pd.DataFrame(doc["signals"]).set_index("column")
    reliability = pd.DataFrame(doc["reliability"])  # the outcome's split-half reliability, per seed
    assert set(reliability["seed"]) == {0, 1} and set(reliability["scope"]) == {"all records", "base texts"}
    assert set(pd.DataFrame(doc["per_seed"])["seed"]) == {0, 1} and "Split-half reliability" in text
    assert "gnq" in signals.index and "loss_ratio" not in signals.index  # a tiny model has no base model
    assert {"gnq_in_run", "gnq_all", "risk_default"} <= set(signals.index)
    kept = pd.DataFrame(doc["positives"])  # a top record counts only where both halves reproduce it
    assert (kept["positives (reproduced)"] + kept["left out"] == kept["top records"]).all()
    assert int(kept.query("scope == 'all records'")["positives (reproduced)"].sum()) == signals.loc[
        "gnq", "positive records"]
    given = pd.DataFrame(doc["given"])
    assert set(given["given"]) == {"length, loss, log copies", "length, loss, log copies, K_jj",
                                   "length, loss, log copies, GNQ", "length, loss, log copies, K_jj in run"}
    assert "log_copies" not in pd.DataFrame(doc["unique_texts"])["column"].tolist()  # constant there
    records = tmp_path / "work" / "counterfactual-quick" / "seed-0" / "records.csv"
    before = records.stat().st_mtime_ns
    assert CliRunner().invoke(app, args, catch_exceptions=False).exit_code == 0  # resumes: nothing retrained
    assert records.stat().st_mtime_ns == before


def test_noise_signal_partial_interval_covers_zero():
    # null samples shaped like the study: records with 1-8 copies, outcome driven by a covariate
    outside = per_text = 0
    for seed in range(60):
        rng = np.random.default_rng(seed)
        copies = rng.choice([1, 1, 1, 2, 4, 8], 120)
        groups = np.repeat(np.arange(120), copies).astype(float)
        z = np.repeat(rng.normal(size=120), copies)
        outcome = z + np.repeat(rng.normal(size=120), copies)
        noise = np.repeat(rng.normal(size=120), copies)
        top = outcome >= np.quantile(outcome, 0.9)
        p = partial_rank_correlation(noise, outcome, [z], groups=groups, labels=top, resamples=200, seed=seed)
        outside += not (p.lo <= 0 <= p.hi)
        t = partial_rank_correlation(noise, outcome, [z], labels=top, resamples=200, seed=seed)
        per_text += not (t.lo <= 0 <= t.hi)
    assert outside <= 6 < per_text  # nominal 5% of 60; resampling copies one by one claims far more
    strong = partial_rank_correlation(z + 0.1 * noise, outcome, [], groups=groups, resamples=200)
    assert strong.lo > 0.3


def test_cv_gain_base_can_hold_k_jj():
    rng = np.random.default_rng(5)
    n = 600
    kjj = rng.normal(size=n)
    y = rng.random(n) < 1 / (1 + np.exp(-2 * kjj))
    lengths, loss = rng.integers(10, 30, n).astype(float), rng.normal(size=n)
    again = lc.cv_gain(kjj + 1e-3 * rng.normal(size=n), y, lengths, loss, resamples=200,
                       copies=np.ones(n), covariates={"K_jj": kjj})
    assert again.base == "length spline + loss + log copies + K_jj" and again.lo <= 0 <= again.hi
    alone = lc.cv_gain(kjj, y, lengths, loss, resamples=200, copies=np.ones(n))
    assert alone.lo > 0.1 and cl.copy_counts(np.ones(3)).tolist() == [3, 3, 3]


def test_odd_model_count_is_one_line_and_exit_one(tmp_path):
    result = CliRunner().invoke(app, ["study", "counterfactual", "--quick", "--models", "3",
                                      "--db", str(tmp_path / "s.duckdb"), "--work", str(tmp_path / "w")])
    assert result.exit_code == 1 and "--models must be even" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "w").exists()


def test_a_reduced_run_says_what_it_reduced():
    assert cs.reductions(cs.FULL) == []
    cut = cs.reductions(replace(cs.FULL, base_texts=145, models=4, max_length=24, exposure_candidates=0,
                                seeds=(0,)))
    assert cut == ["145 base texts instead of 1000", "24 tokens kept per text instead of 64",
                   "K = 4 half-trained models instead of at least 8", "1 seed instead of 3",
                   "no exposure of the planted values"]
    assert cs.reductions(cs.TINY)[0].startswith("model `tiny`") and cs.TINY.models == 8


def test_measured_cost_per_model_and_rate():
    meta = [{"config": {"models": 8, "epochs": 1, "model": "smollm2"},
             "seconds": {"half-trained models": 800.0}, "training_tokens_half": 2000, "tokens": 3000,
             "seconds_total": 1000.0, "cpu_seconds": 900.0}]
    assert cs.per_model_seconds(meta) == 100.0
    assert cs.measured_rate(meta) == 800.0 / (8 * (2000 + 1000))
    cost = cs.full_cost(meta)
    assert cost["seconds_per_token_trained"] == cs.measured_rate(meta)
    assert "this run's 1 seed" in cost["rate_source"] and cost["this_run_cpu_seconds"] == 900.0
    assert cost["estimated_hours_k16"] > cost["estimated_hours_k8"] > 0 and cost["cpu_share"] == 0.9
    assert abs(cost["estimated_cpu_hours_k8"] - 0.9 * cost["estimated_hours_k8"]) < 1e-9


def test_unknown_model_is_one_line_and_exit_one(tmp_path):
    result = CliRunner().invoke(app, ["study", "counterfactual", "--model", "gpt9",
                                      "--db", str(tmp_path / "s.duckdb"), "--work", str(tmp_path / "w")])
    assert result.exit_code == 1 and "--model must be smollm2 or tiny" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "w").exists()


def test_split_half_reliability_tells_a_real_outcome_from_noise():
    """Each half of the model pairs measures counterfactual memorisation alone: where records
    truly differ the halves agree (Spearman–Brown near 1), where they do not it is about 0."""
    from research.studies.counterfactual import cf_subset, split_half_reliability, split_halves

    rng = np.random.default_rng(0)
    n, models = 200, 8
    subsets = [cf_subset(n, m, seed=3) for m in range(models)]
    for effect, reliable in ((rng.exponential(1.0, n), True), (np.zeros(n), False)):
        scores = []
        for subset in subsets:
            member = np.zeros(n, dtype=bool)
            member[subset] = True
            scores.append((effect * member + rng.normal(0, 0.3, n)).tolist())
        a, b = split_halves(n, subsets, scores)
        got = split_half_reliability(a, b)
        assert got["records"] == n
        if reliable:
            assert got["spearman_brown"] > 0.9 and got["top_agreement"] > 0.6
        else:
            assert abs(got["spearman_halves"]) < 0.2 and got["top_agreement"] < 0.35
    assert np.isnan(split_halves(n, subsets[:2], scores[:2])[0]).all()  # one pair: no halves


def test_in_run_gnq_trains_the_same_model_as_the_plain_fine_tune():
    """The in-run auditor reads each step's per-example gradients and leaves training as it was:
    the model it trains equals ``fine_tune``'s, parameter for parameter up to float64 rounding
    (the fused layers form the weight gradient in their own matmul), and every record gets a
    positive GNQ and K_jj."""
    from research.studies.companions import fine_tune, load_model

    cfg = replace(cs.QUICK, max_length=24, epochs=2)
    texts = [f"record {i}: the code is {1000 + 37 * i}" for i in range(11)]
    model, tok = load_model(cfg, texts, seed=3)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    ids = cs.encode_texts(tok, texts, cfg.max_length)
    everything = cs.expanded(list(range(len(texts))), np.array([1] * 9 + [2, 3]))
    gnq, kjj = cs.in_run_fine_tune(model, ids, everything, cs.pad_id(tok), cfg, seed=1)
    audited = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(init)
    fine_tune(model, [ids[r] for r in everything], cs.pad_id(tok), lr=cfg.lr, epochs=cfg.epochs,
              batch_size=cfg.batch_size, seed=1000 + cfg.models)
    moved = max(float((v - init[k]).abs().max()) for k, v in model.state_dict().items())
    apart = max(float((audited[k] - v).abs().max()) for k, v in model.state_dict().items())
    assert moved > 1e-2 and apart < 1e-12  # trained, and trained alike
    assert np.isfinite(gnq).all() and (gnq > 0).all() and (kjj > 0).all()
