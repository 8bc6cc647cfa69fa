"""analysis.length_control, analysis.evidence and analysis.gnq_nature on synthetic data with known
answers: the length control removes a length-only signal, the CV gain sees added
information and only that, TPR at low FPR equals scikit-learn's, the frame contract's outcomes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_curve

from gnq_core.analysis import evidence as ev
from gnq_core.analysis import gnq_nature
from gnq_core.analysis import length_control as lc
from gnq_core.analysis import predictive as pr


def _length_driven(n: int = 1500, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Token lengths 8..39 and an outcome that length alone predicts (short = positive)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(8, 40, n).astype(float)
    y = rng.random(n) < 1 / (1 + np.exp((lengths - 24) / 3))
    return lengths, y


def _old_three_bin_auc(score: np.ndarray, y: np.ndarray, lengths: np.ndarray) -> float:
    """The control this replaces: 3 quantile bins of length, unweighted mean of the bins' AUCs."""
    bins = pd.qcut(pd.Series(lengths).rank(method="min"), 3, labels=False, duplicates="drop").to_numpy()
    aucs = [pr.metrics_matrix(score[bins == b], y[bins == b])["auc"][0] for b in np.unique(bins)
            if 0 < y[bins == b].sum() < (bins == b).sum()]
    return float(np.mean(aucs))


def test_a_length_only_signal_scores_one_half_within_exact_length():
    lengths, y = _length_driven()
    signal = -lengths  # the signal is the text length (short = positive, its direction)
    assert pr.metrics_matrix(signal, y)["auc"][0] >= 0.8  # length alone predicts the outcome
    w = pr.within_length_auc(signal, y, lengths, resamples=200)
    assert w.auc == pytest.approx(0.5, abs=0.05) and w.lo <= w.auc <= w.hi
    assert w.strata >= 10 and w.pairs > 0
    merged = pr.within_length_auc(signal, y, lengths, resamples=50, merge=True)
    assert merged.auc == pytest.approx(0.5, abs=0.05) and merged.merged > 0
    # the old control let length predict inside its bins
    assert _old_three_bin_auc(signal, y, lengths) > 0.6


def test_within_length_auc_is_pair_weighted_and_merges_only_when_asked():
    # length 10: 1 positive, 1 negative (1 pair, AUC 1); length 20: 10 × 10 (100 pairs, AUC 0)
    lengths = np.array([10, 10] + [20] * 20, dtype=float)
    y = np.array([True, False] + [True] * 10 + [False] * 10)
    s = np.array([1.0, 0.0] + [0.0] * 10 + [1.0] * 10)
    w = pr.within_length_auc(s, y, lengths, resamples=50)
    assert w.auc == pytest.approx(1 / 101) and w.pairs == 101 and w.strata == 2  # not (1 + 0) / 2
    lengths = np.array([5, 6, 7, 7, 8, 9], float)
    labels = np.array([1, 1, 1, 0, 1, 1], bool)
    assert list(pr.length_strata(lengths, labels)) == [0, 1, 2, 2, 3, 4]  # exact length by default
    # merge=True: 5 and 6 (positives only) join 7; 8 and 9 join the last stratum
    assert list(pr.length_strata(lengths, labels, merge=True)) == [0, 0, 0, 0, 0, 0]
    strata = pr.length_strata(np.array([5, 5, 6, 6], float), np.array([1, 0, 1, 0], bool), merge=True)
    assert list(strata) == [0, 0, 1, 1]  # both lengths hold both outcomes: never merged


def test_within_length_interval_covers_one_half_for_a_random_signal():
    rng = np.random.default_rng(2)
    covered = []
    for seed in range(40):  # resampling each length alone covered 0.5 in 60-68% here
        lengths, y = _length_driven(300, seed)
        w = pr.within_length_auc(rng.random(300), y, lengths, resamples=200, seed=seed)
        covered.append(w.lo <= 0.5 <= w.hi)
    assert np.mean(covered) >= 0.85  # nominal 95%


def test_cv_gain_sees_added_information_and_nothing_in_a_copy_of_loss():
    lengths, y = _length_driven(1200, 1)
    rng = np.random.default_rng(1)
    loss = rng.normal(size=len(y)) - 0.8 * y
    informative = rng.normal(size=len(y)) + 1.0 * y   # independent of length and loss given y
    gain = lc.cv_gain(informative, y, lengths, loss, resamples=200)
    assert gain.gain > 0.01 and gain.lo > 0 and gain.lr_p < 1e-6 and gain.base == "length spline + loss"
    copy = lc.cv_gain(-loss, y, lengths, loss, resamples=200)  # a signal that is loss again
    assert abs(copy.gain) < 0.005 and copy.lo <= 0 <= copy.hi + 1e-9
    length_only = lc.cv_gain(-lengths, y, lengths, loss, resamples=200)
    assert abs(length_only.gain) < 0.005
    itself = lc.cv_gain(loss, y, lengths, loss, resamples=200, signal_is_loss=True)
    assert itself.base == "length spline" and itself.lo > 0  # loss over length alone
    few = lc.cv_gain(informative[:20], y[:20] & (np.arange(20) < 3), lengths[:20], loss[:20])
    assert np.isnan(few.gain) and "at least 5" in few.note


def test_tpr_at_low_fpr_equals_scikit_learn_at_membership_sizes():
    rng = np.random.default_rng(7)
    n = 4000
    member = rng.random(n) < 0.5
    score = rng.normal(size=n) + 0.7 * member
    frame = pd.DataFrame({"example_id": range(n), "member": member, "loss_last": -score,
                          "n_tokens": rng.integers(10, 20, n)})
    table = ev.evidence_table(frame, resamples=50, cv=False)
    row = table[(table["signal"] == "loss_last") & (table["scope"] == ev.SCOPE_ALL)].iloc[0]
    assert row["outcome"] == "membership" and row["positives"] == member.sum()
    fpr, tpr, _ = roc_curve(member, score, drop_intermediate=False)
    for alpha in ev.FPR_LEVELS:
        assert row[f"tpr@{alpha:g}"] == pytest.approx(tpr[fpr <= alpha + 1e-12].max(), abs=1e-12)
        assert row[f"tpr@{alpha:g} lo"] <= row[f"tpr@{alpha:g}"] <= row[f"tpr@{alpha:g} hi"]


def test_evidence_outcomes_follow_the_frame_contract():
    rng = np.random.default_rng(3)
    n = 120
    frame = pd.DataFrame({"example_id": range(n), "n_tokens": rng.integers(5, 9, n),
                          "loss_last": rng.random(n), "gnq_total": rng.random(n),
                          "extracted": pd.array([True, False, None] * (n // 3), dtype="boolean"),
                          "member": True, "group": np.where(np.arange(n) % 2, "facts", "claims")})
    found = {(o.name, o.positive) for o in ev.outcomes_in(frame)}
    assert found == {("extraction", "extracted"), ("group", "group = claims")}  # members only: no membership
    table = ev.evidence_table(frame, resamples=30, cv=False)
    ext = table[(table["outcome"] == "extraction") & (table["scope"] == ev.SCOPE_ALL)]
    assert (ext["n"] == 2 * n // 3).all()  # texts without an outcome are left out
    shown = ev.display(table, "extraction")
    assert {"AUC (all texts)", "TPR @ 0.1% FPR", "AUC within exact length"} <= set(shown.columns)


# ----------------------------------------------------------------------------------------- GNQ vs ‖g‖²
def _scores(gnq: list[float], k: list[float], batch: list[int]) -> pd.DataFrame:
    return pd.DataFrame({"example_id": range(len(gnq)), "point": 0, "batch_index": batch, "gnq": gnq,
                         "self_influence": k, "loss": 1.0})


def test_unexplained_share_with_absolute_and_relative_lambda():
    s = _scores([90.0, 50.0, 10.0, 40.0], [1.0, 1.0, 0.2, 0.6], [0, 0, 1, 1])
    r = gnq_nature.unexplained_share(s, 0.01)
    assert np.allclose(r, [0.9, 0.5, 0.5, 40 * 0.01 / 0.6])
    rel = gnq_nature.unexplained_share(s, 0.1, "relative")  # λ_eff = 0.1 × the batch's mean K_jj
    assert np.allclose(rel, [90 * 0.1 * 1.0 / 1.0, 50 * 0.1, 10 * 0.1 * 0.4 / 0.2, 40 * 0.1 * 0.4 / 0.6])


def test_the_sentence_says_gnq_ranks_like_the_gradient_norm_only_when_it_does():
    rng = np.random.default_rng(0)
    k = rng.lognormal(0, 2, 200)
    like = _scores(list(k / 0.01 * rng.uniform(0.97, 1.0, 200)), list(k), [0] * 200)
    text = gnq_nature.summary(like, 0.01)["sentence"]
    assert text.startswith("Batch companions explain under 5%") and "ranks like the gradient norm" in text
    unlike = _scores(list(k / 0.01 * rng.uniform(0.05, 1.0, 200)), list(k), [0] * 200)
    summary = gnq_nature.summary(unlike, 0.01)
    assert "does not" in summary["sentence"] and summary["explained_median"] > 0.25


def test_record_gnq_sums_the_batches_where_one_copy_appears():
    # cluster 0 = texts 0, 1, 2; point 0: 0 and 1 share batch 0 (left out), 2 alone in batch 1;
    # point 1: each copy in its own batch.
    s = pd.DataFrame({"example_id": [0, 1, 2, 3, 0, 1, 2, 3], "point": [0, 0, 0, 0, 1, 1, 1, 1],
                      "batch_index": [0, 0, 1, 1, 0, 1, 2, 2],
                      "gnq": [1.0, 1.0, 5.0, 7.0, 4.0, 3.0, 2.0, 9.0], "self_influence": 1.0})
    clusters = pd.DataFrame({"example_id": [0, 1, 2, 3], "cluster_id": [0, 0, 0, np.nan]})
    rec = gnq_nature.record_gnq(s, clusters).set_index("cluster_id")
    assert list(rec.index) == [0]  # a unique text has no record of its own
    assert rec.loc[0, "record_gnq"] == pytest.approx(5.0 + 4.0 + 3.0 + 2.0)
    assert rec.loc[0, "shared_batches"] == 1 and not rec.loc[0, "complete"] and rec.loc[0, "copies"] == 3


def test_non_members_join_as_the_membership_outcome():
    rng = np.random.default_rng(5)
    members = pd.DataFrame({"example_id": range(300), "n_tokens": rng.integers(5, 15, 300),
                            "loss_last": rng.normal(size=300) - 0.8,
                            "extracted": pd.array(rng.random(300) < 0.2, dtype="boolean")})
    others = pd.DataFrame({"example_id": range(300), "n_tokens": rng.integers(5, 15, 300),
                           "loss_last": rng.normal(size=300)})
    frame = ev.with_non_members(members, others)
    assert frame["example_id"].is_unique and frame["member"].sum() == 300
    assert frame.loc[frame["member"] == False, "extracted"].isna().all()  # noqa: E712
    table = ev.evidence_table(frame, resamples=50, cv=False)
    row = table[(table["outcome"] == "membership") & (table["scope"] == ev.SCOPE_ALL)].iloc[0]
    assert row["n"] == 600 and row["positives"] == 300 and row["auc lo"] > 0.6  # lower loss = member
    ext = table[(table["outcome"] == "extraction") & (table["scope"] == ev.SCOPE_ALL)].iloc[0]
    assert ext["n"] == 300  # non-members carry no extraction outcome
