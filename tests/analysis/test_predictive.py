"""analysis.predictive on synthetic data with known answers, and against scikit-learn."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score, roc_curve

from gnq_core.analysis import clusters as cl
from gnq_core.analysis import predictive as pr


def _frame(n: int = 200, seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    y = np.zeros(n, dtype=bool)
    y[rng.choice(n, n // 4, replace=False)] = True
    return pd.DataFrame({
        "extracted": y,
        "gnq_total": np.where(y, 10.0, 1.0) + rng.random(n),          # perfect, higher = extracted
        "loss_last": np.where(y, 0.1, 2.0) + rng.random(n) * 0.05,   # perfect, lower = extracted
        "gnq_max": -(np.where(y, 10.0, 1.0) + rng.random(n)),        # perfect but the wrong way round
        "zlib_ratio": rng.random(n),                                 # noise
        "n_tokens": rng.integers(5, 60, n),
    })


def test_perfect_reversed_and_random_signals():
    result = pr.evaluate(_frame(), resamples=300, seed=0, )
    t = result.table.set_index("signal")
    assert t.loc["gnq_total", "auc"] == 1.0 and t.loc["gnq_total", "auc lo"] == 1.0
    assert t.loc["loss_last", "auc"] == 1.0  # its stated direction (lower) is applied
    assert t.loc["loss_last", "direction"] == "lower"
    assert t.loc["gnq_max", "auc"] == 0.0 and t.loc["gnq_max", "auc hi"] == 0.0
    noise = t.loc["zlib_ratio"]
    assert abs(noise["auc"] - 0.5) < 0.12 and noise["auc lo"] < noise["auc"] < noise["auc hi"]
    for metric in ("tpr@0.01", "tpr@0.1", "precision@0.05", "precision@0.1", "precision@0.2"):
        assert t.loc["gnq_total", metric] == 1.0
        assert t.loc["gnq_max", metric] == 0.0
    assert set(result.table["scope"]) == {pr.ALL}


def test_point_estimates_equal_scikit_learn_with_ties():
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(5, 80))
        y = rng.random(n) < rng.uniform(0.1, 0.9)
        y[0], y[1] = True, False
        s = rng.integers(0, 6, n).astype(float)  # many ties
        m = pr.metrics_matrix(s, y)
        assert m["auc"][0] == pytest.approx(roc_auc_score(y, s), abs=1e-12)
        fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
        ours = pr.roc_curve_points(s, y)
        np.testing.assert_allclose(ours[0], fpr)
        np.testing.assert_allclose(ours[1], tpr)
        for alpha in pr.FPR_LEVELS:
            assert m[f"tpr@{alpha:g}"][0] == pytest.approx(tpr[fpr <= alpha + 1e-12].max(), abs=1e-12)


def test_random_signal_interval_covers_one_half_about_as_often_as_stated():
    rng = np.random.default_rng(11)
    covered = []
    for seed in range(60):
        y = rng.random(120) < 0.3
        boot = pr.bootstrap(rng.random(120), y, 300, seed)
        lo, hi = pr.interval(boot["auc"], 0.95)
        covered.append(lo <= 0.5 <= hi)
    assert np.mean(covered) >= 0.85  # nominal 95%; 60 trials: ≥ 0.85 unless the interval is broken


def test_a_weighted_row_equals_the_resample_written_out():
    """The bootstrap weights texts instead of copying them: same numbers as the explicit resample."""
    rng = np.random.default_rng(5)
    n = 40
    y = rng.random(n) < 0.4
    y[:2] = [True, False]
    s = rng.integers(0, 8, n).astype(float)
    weights = cl.cluster_weights(y, None, 25, 2)
    batch = pr.metrics_matrix(s, y, weights)
    for i, w in enumerate(weights.astype(int)):
        one = pr.metrics_matrix(np.repeat(s, w), np.repeat(y, w))
        for key, values in batch.items():
            assert values[i] == pytest.approx(one[key][0], abs=1e-12), key
        assert batch["auc"][i] == pytest.approx(roc_auc_score(np.repeat(y, w), np.repeat(s, w)), abs=1e-12)


def test_tpr_at_fpr_known_values():
    # 10 extracted, 100 kept; scores: extracted 1..10 → 5 of them above every kept text,
    # 1 kept text above the other 5 extracted.
    y = np.array([True] * 10 + [False] * 100)
    s = np.concatenate([[100, 99, 98, 97, 96, 50, 49, 48, 47, 46], [60], np.arange(99) * 0.1])
    m = pr.metrics_matrix(s, y)
    assert m["tpr@0.01"][0] == pytest.approx(1.0)  # the 1 kept text above them is 1% FPR
    m = pr.metrics_matrix(np.where(s == 60, 200, s), y)  # now it tops the list
    assert m["tpr@0.01"][0] == pytest.approx(1.0)
    s2 = s.copy()
    s2[10:12] = [98.5, 98.5]  # two kept texts among the top extracted: 2% FPR to go past them
    m = pr.metrics_matrix(s2, y)
    assert m["tpr@0.01"][0] == pytest.approx(0.2)
    assert m["tpr@0.1"][0] == pytest.approx(1.0)


def test_precision_at_top_fraction_and_ties():
    y = np.array([True, True, False, True] + [False] * 16)
    s = np.arange(20, 0, -1).astype(float)  # already in descending order
    m = pr.metrics_matrix(s, y)
    assert m["precision@0.05"][0] == 1.0                  # k = 1
    assert m["precision@0.1"][0] == 1.0                   # k = 2
    assert m["precision@0.2"][0] == pytest.approx(3 / 4)  # k = 4
    const = pr.metrics_matrix(np.zeros(20), y)
    for q in pr.TOP_FRACTIONS:  # all tied: the base rate exactly
        assert const[f"precision@{q:g}"][0] == pytest.approx(3 / 20)
    assert const["auc"][0] == 0.5 and const["tpr@0.1"][0] == 0.0
    # a tie across the cut at k = 2: one sure place above, one of two tied places (one extracted)
    m = pr.metrics_matrix(np.array([3.0, 2.0, 2.0, 1.0]), np.array([True, True, False, False]),
                          fractions=[0.5])
    assert m["precision@0.5"][0] == pytest.approx((1 + 0.5) / 2)


def test_bootstrap_is_deterministic_by_seed_and_stratified():
    f = _frame()
    a = pr.evaluate(f, resamples=200, seed=7).table
    b = pr.evaluate(f, resamples=200, seed=7).table
    c = pr.evaluate(f, resamples=200, seed=8).table
    pd.testing.assert_frame_equal(a, b)
    assert not np.array_equal(a["auc lo"].to_numpy(), c["auc lo"].to_numpy())  # another seed, other resamples
    y = f["extracted"].to_numpy()
    weights = cl.cluster_weights(y, None, 50, 0)
    assert (weights[:, y].sum(axis=1) == y.sum()).all() and (weights[:, ~y].sum(axis=1) == (~y).sum()).all()
    # chunked evaluation gives the same numbers as one block
    s = f["zlib_ratio"].to_numpy()
    whole = pr.bootstrap(s, y, 64, 3)
    old, pr._CELLS = pr._CELLS, 1000
    try:
        chunked = pr.bootstrap(s, y, 64, 3)
    finally:
        pr._CELLS = old
    np.testing.assert_array_equal(whole["auc"], chunked["auc"])


def test_missing_signals_and_one_class():
    f = _frame(300)
    result = pr.evaluate(f, resamples=100)
    assert set(result.table["scope"]) == {pr.ALL} and "exact token length" in result.method()
    assert "risk" not in set(result.table["signal"])  # absent column: absent row
    only_kept = f.assign(extracted=False)
    none = pr.evaluate(only_kept, resamples=100)
    assert none.table["auc"].isna().all()
    assert "both extracted and kept" in pr.best_signal_sentence(none)
    partial = f.assign(loss_ratio=np.where(np.arange(len(f)) % 2, np.nan, f["gnq_total"]))
    row = pr.evaluate(partial, resamples=100).table.set_index("signal").loc["loss_ratio"]
    assert row["n"] == len(f) // 2


def test_sentences_are_honest_about_overlap():
    rng = np.random.default_rng(0)
    n = 120
    y = rng.random(n) < 0.3
    f = pd.DataFrame({"extracted": y,
                      "gnq_total": y + rng.normal(0, 1.5, n),   # two similar, weak signals
                      "gnq_last": y + rng.normal(0, 1.5, n),
                      "n_tokens": 10})
    result = pr.evaluate(f, resamples=300, )
    text = pr.best_signal_sentence(result)
    assert "do not tell the two apart" in text and "predicts extraction best" in text
    clear = pr.evaluate(_frame(), resamples=300, )
    text = pr.best_signal_sentence(clear)
    assert "Pointing the other way" in text and "GNQ_max" in text
    display = pr.display_table(clear)
    assert display["AUC"].iloc[0].startswith("1.00 [1.00, 1.00]")
    assert set(display["direction"]) == {"higher = extracted", "lower = extracted"}


def test_roc_points_per_signal():
    points = pr.roc_points(_frame())
    assert set(points["signal"]) == {"gnq_total", "loss_last", "gnq_max", "zlib_ratio", "n_tokens"}
    perfect = points[points["signal"] == "gnq_total"]
    assert ((perfect["fpr"] == 0) & (perfect["tpr"] == 1)).any()


# -------------------------------------------------------------------- intervals of rates and AUCs
def test_rate_interval_contains_the_rate_and_narrows_with_n():
    rng = np.random.default_rng(0)
    small = rng.random(40) < 0.3
    large = rng.random(4000) < 0.3
    r_s, lo_s, hi_s = pr.rate_interval(small)
    r_l, lo_l, hi_l = pr.rate_interval(large)
    assert lo_s <= r_s <= hi_s and lo_l <= r_l <= hi_l
    assert r_s == small.mean() and r_l == large.mean()
    assert hi_l - lo_l < (hi_s - lo_s) / 4  # ~1/√n: 10× the width at 100× the texts
    assert all(np.isnan(pr.rate_interval([])))


def test_rate_interval_never_collapses_at_zero_or_all():
    """The bootstrap gave [0, 0] for 0 of 10 and [1, 1] for 10 of 10; Wilson does not."""
    rate, lo, hi = pr.rate_interval(np.ones(10, bool))
    assert rate == 1.0 and hi == pytest.approx(1.0) and 0.6 < lo < 0.8  # Wilson 95%: 0.722
    rate, lo, hi = pr.rate_interval(np.zeros(10, bool))
    assert rate == 0.0 and lo == pytest.approx(0.0, abs=1e-12) and 0.2 < hi < 0.35  # 0.278


def test_rate_interval_covers_the_true_rate_about_as_often_as_stated():
    rng = np.random.default_rng(4)
    for p in (0.02, 0.3):
        covered = [(lambda r: r[1] <= p <= r[2])(pr.rate_interval(rng.random(60) < p)) for _ in range(400)]
        assert 0.90 <= np.mean(covered) <= 0.995, (p, np.mean(covered))


def test_evaluate_reports_the_stratified_auc_next_to_the_raw_one():
    f = _frame()
    result = pr.evaluate(f, resamples=100, seed=0)
    table = result.stratified.set_index("signal")
    overall = result.table[result.table["scope"] == pr.ALL].set_index("signal")
    for signal in table.index:
        assert table.loc[signal, "auc"] == pytest.approx(overall.loc[signal, "auc"])
        assert table.loc[signal, "stratified lo"] <= table.loc[signal, "stratified auc"] \
            <= table.loc[signal, "stratified hi"]
