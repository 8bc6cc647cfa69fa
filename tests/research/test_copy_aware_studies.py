"""The studies' intervals count records, not texts: copies of one record are resampled together,
"too few" replaces an interval under clusters.MIN_RECORDS independent records, and the copy count
sits in the base of every CV gain."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from gnq_core.analysis import clusters as cl
from gnq_core.analysis import length_control as lc
from research.studies import common_knowledge as ck
from research.studies import report as rep
from research.studies.real_model_report import MEMBERSHIP_SIGNALS, membership_table


def _copied(records: int, copies: int, negatives: int, seed: int = 0):
    """Positives: ``records`` records, each ``copies`` times (copies share a score, as copies of
    one text do); negatives unique.  Scores separate the classes weakly."""
    rng = np.random.default_rng(seed)
    pos = np.repeat(rng.normal(0.5, 1.0, records), copies)
    neg = rng.normal(0.0, 1.0, negatives)
    scores = np.concatenate([pos, neg])
    labels = np.r_[np.ones(len(pos), bool), np.zeros(negatives, bool)]
    groups = np.r_[np.repeat(np.arange(records), copies), 1000 + np.arange(negatives)].astype(float)
    return scores, labels, groups


def test_copies_of_few_records_widen_the_auc_interval():
    scores, labels, groups = _copied(records=12, copies=6, negatives=72)
    lo_text, hi_text = rep.auc_interval(scores, labels, seed=0)             # 72 "independent" positives
    lo_rec, hi_rec = rep.auc_interval(scores, labels, seed=0, groups=groups)  # 12 records
    assert hi_rec - lo_rec > 1.5 * (hi_text - lo_text)


def test_too_few_records_get_no_interval():
    scores, labels, groups = _copied(records=6, copies=10, negatives=60)   # 60 texts, 6 records
    assert all(math.isnan(v) for v in rep.auc_interval(scores, labels, seed=0, groups=groups))
    assert not any(math.isnan(v) for v in rep.auc_interval(scores, labels, seed=0))  # per text: a claim
    auc = 0.6
    assert f"{cl.TOO_FEW}: 6 vs 60 records" in rep.auc_cell(auc, scores, labels, 0, groups)


def test_common_knowledge_loss_gap_and_auc_are_copy_aware():
    scores, labels, groups = _copied(records=12, copies=6, negatives=72, seed=1)
    before = pd.DataFrame({"group": np.where(labels, ck.POSITIVE, ck.NEGATIVE), "loss": scores})
    gap, lo, hi = ck.loss_gap(before, seed=0)
    gap_c, lo_c, hi_c = ck.loss_gap(before, seed=0, clusters=groups)
    assert gap == gap_c and hi_c - lo_c > 1.5 * (hi - lo)
    s, y, g = _copied(records=5, copies=10, negatives=50)
    few = pd.DataFrame({"group": np.where(y, ck.POSITIVE, ck.NEGATIVE), "loss": s})
    assert math.isnan(ck.loss_gap(few, 0, g)[1]) and not math.isnan(ck.loss_gap(few, 0)[1])
    cells = ck.auc_intervals(pd.Series(scores), before["group"], pd.Series(np.full(len(scores), 9)), 0,
                             groups)
    assert cells["auc hi"] - cells["auc lo"] > 0 and "[" in cells["AUC [95% CI]"]
    examples = pd.DataFrame({"example_id": np.arange(len(scores)), cl.CLUSTER: groups})
    assert np.array_equal(ck.copy_clusters(examples, pd.Series(np.arange(len(scores)))), groups)


def test_real_model_membership_table_counts_copied_members_once():
    rng = np.random.default_rng(3)
    texts = [f"member record {i}" for i in range(6) for _ in range(8)] + [f"other {i}" for i in range(48)]
    frame = pd.DataFrame({"text": texts, "member": [True] * 48 + [False] * 48,
                          **{c: rng.normal(size=96) for c, _, _ in MEMBERSHIP_SIGNALS}})
    table = membership_table(frame)
    assert (table["member records"] == 6).all() and (table["AUC [95% CI]"] == cl.TOO_FEW).all()
    unique = frame.assign(text=[f"text {i}" for i in range(96)])
    assert (membership_table(unique)["AUC [95% CI]"] != cl.TOO_FEW).all()


def test_copy_count_in_the_cv_base_removes_a_gain_that_is_duplicate_counting():
    # A GNQ-like signal ≈ 1/copies: with the copy count outside the base it "gains"; inside, not.
    rng = np.random.default_rng(4)
    records = 400
    copies = rng.choice([1, 2, 4, 8], records)
    extracted = rng.random(records) < 0.05 + 0.2 * np.log2(copies)  # copies drive extraction
    groups = np.repeat(np.arange(records), copies).astype(float)
    y = np.repeat(extracted, copies)
    m = np.repeat(copies, copies).astype(float)
    lengths = rng.integers(20, 40, len(y)).astype(float)
    loss = rng.normal(size=len(y))
    gnq = 1.0 / m + 0.01 * rng.normal(size=len(y))
    without = lc.cv_gain(gnq, y, lengths, loss, resamples=200, groups=groups)
    within = lc.cv_gain(gnq, y, lengths, loss, resamples=200, groups=groups, copies=cl.copy_counts(groups))
    assert without.lo > 0                                   # duplicate counting passes as a gain
    assert within.lo <= 0 <= within.hi and abs(within.gain) < 0.02
    assert within.base == "length spline + loss + log copies"
    assert np.array_equal(cl.copy_counts(np.array([3.0, 3.0, 1.0])), [2, 2, 1])
