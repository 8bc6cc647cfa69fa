"""analysis.clusters: copies are one record for resampling, folds, counts and the record view."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gnq_core.analysis import clusters as cl
from gnq_core.analysis.risk import FOLDS, grouped_folds


def _old_stratified_weights(labels: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """The per-text stratified bootstrap as it was before copy clusters (written out)."""
    y = np.asarray(labels, dtype=bool)
    n = len(y)
    rng = np.random.default_rng(seed)
    drawn = [members[rng.integers(0, len(members), (resamples, len(members)))]
             for members in (np.flatnonzero(y), np.flatnonzero(~y)) if len(members)]
    flat = (np.concatenate(drawn, axis=1) + n * np.arange(resamples)[:, None]).ravel()
    return np.bincount(flat, minlength=resamples * n).reshape(resamples, n).astype(float)


def test_without_copies_the_cluster_bootstrap_is_the_text_bootstrap_draw_for_draw():
    y = np.random.default_rng(0).random(57) < 0.3
    singletons = np.arange(57) * 3.0 + 1
    expected = _old_stratified_weights(y, 40, 5)
    assert np.array_equal(cl.cluster_weights(y, None, 40, 5), expected)
    assert np.array_equal(cl.cluster_weights(y, singletons, 40, 5), expected)


def test_a_drawn_cluster_brings_all_its_copies_and_class_sizes_in_records_hold():
    groups = np.array([7, 7, 7, 1, 2, 2, 3, 4, 5, 6], dtype=float)
    y = np.array([1, 1, 1, 0, 1, 0, 0, 0, 0, 0], dtype=bool)  # cluster 2 mixed: a positive record
    w = cl.cluster_weights(y, groups, 200, 1)
    for members in ([0, 1, 2], [4, 5]):
        assert (w[:, members] == w[:, members[:1]]).all()
    positive_clusters = w[:, 0] + w[:, 4]
    assert (positive_clusters == 2).all()          # 2 positive records drawn per resample
    assert cl.records(y, groups) == (2, 5)
    assert cl.effective_records(y, groups) == (3 + 2) ** 2 / (9 + 4)  # Kish: positives are rarer
    assert cl.too_few(y, groups).startswith(cl.TOO_FEW) and not cl.too_few(y, groups, minimum=2)


def test_expanded_level_widens_for_few_records_only():
    assert cl.expanded_level(0.95, np.inf) == 0.95
    assert cl.expanded_level(0.95, 10) > 0.98
    assert 0.95 < cl.expanded_level(0.95, 1000) < 0.951


def test_collapse_gives_one_record_per_cluster():
    frame = pd.DataFrame({"example_id": [0, 1, 2, 3], "cluster_id": [0, 0, np.nan, 3],
                          "gnq_total": [1.0, 3.0, 5.0, 7.0],
                          "extracted": pd.array([False, True, pd.NA, pd.NA], dtype="boolean"),
                          "group": ["a", "a", "b", "c"]})
    out = cl.collapse(frame)
    assert list(out["example_id"]) == [0, 2, 3]
    assert list(out["gnq_total"]) == [2.0, 5.0, 7.0]
    assert list(out["copies"]) == [2, 1, 1]
    assert out["extracted"].tolist()[0] is True and out["extracted"].isna().tolist() == [False, True, True]


def test_verdict_folds_keep_copies_together_and_balance_outcomes():
    rng = np.random.default_rng(2)
    groups = pd.Series(np.repeat(np.arange(60), rng.integers(1, 5, 60)).astype(float))
    y = pd.Series(groups.map(dict(enumerate(rng.random(60) < 0.25))).astype(bool))
    folds = grouped_folds(y, groups, seed=0)
    assert (folds.groupby(groups).nunique() == 1).all()
    per_fold = y.groupby(groups).any().groupby(folds.groupby(groups).first()).sum()
    assert per_fold.max() - per_fold.min() <= 1 and len(per_fold) == FOLDS


def test_rates_get_wilson_intervals_over_effective_records_never_zero_width():
    from gnq_core.analysis import predictive as pr
    from gnq_core.analysis.predictive import wilson_interval

    assert cl.wilson(0.0, 20)[1] > 0.1 and cl.wilson(1.0, 20)[0] < 0.9
    assert np.allclose(cl.wilson(7 / 20, 20), wilson_interval(7, 20))  # scipy's, at whole counts
    rng = np.random.default_rng(4)
    s, y = rng.normal(size=300), rng.random(300) < 0.1
    groups = np.repeat(np.arange(75), 4).astype(float)  # every record 4 copies
    y = np.repeat(rng.random(75) < 0.2, 4)
    boot = pr.bootstrap(s, y, 50, 0, groups)
    for key in ("tpr@0.01", "precision@0.05"):
        value = float(pr.metrics_matrix(s, y)[key][0])
        lo, hi = pr.metric_interval(key, value, boot[key], s, y, groups)
        alone = pr.metric_interval(key, value, boot[key], s, y, None)
        assert lo <= value <= hi and hi > lo and (hi - lo) > (alone[1] - alone[0])  # copies count once


def test_collapse_leaves_a_label_unknown_where_copies_disagree_but_an_event_positive():
    frame = pd.DataFrame({"example_id": [0, 1, 2, 3, 4], "cluster_id": [0, 0, 2, 2, np.nan],
                          "extracted": pd.array([True, False, False, False, True], dtype="boolean"),
                          "claim": pd.array([True, False, True, True, pd.NA], dtype="boolean")})
    out = cl.collapse(frame, outcomes=("extracted",), properties=("claim",))
    assert out["extracted"].tolist() == [True, False, True]  # leaked if any copy leaked
    assert out["claim"].isna().tolist() == [True, False, True] and out["claim"].iloc[1]
    assert cl.mixed_records(frame["claim"], cl.groups_of(frame)) == 1
    assert cl.collapse(frame)["copies"].tolist() == [2, 2, 1]


def test_records_unit_leaves_out_records_whose_copies_disagree_on_a_group_and_says_how_many():
    from gnq_core.analysis import evidence as ev

    rng = np.random.default_rng(4)
    singles, pairs = 40, 12  # each pair: a fact and its made-up claim, near copies of each other
    n = singles + 2 * pairs
    cluster = np.r_[np.full(singles, np.nan), np.repeat(singles + np.arange(pairs), 2)]
    claim = np.r_[np.arange(singles) % 2 == 0, np.tile([True, False], pairs)]
    extracted = np.r_[np.arange(singles) % 3 == 0, np.tile([False, True], pairs)]
    frame = pd.DataFrame({"example_id": range(n), "cluster_id": cluster, "n_tokens": rng.integers(5, 9, n),
                          "loss_last": rng.random(n), "gnq_total": rng.random(n), "extracted": extracted,
                          "group": np.where(claim, "claims", "facts")})
    table = ev.evidence_table(frame, resamples=30, cv=False, min_records=5)
    gnq = table[(table["scope"] == ev.SCOPE_ALL) & (table["signal"] == "gnq_total")]
    rows = gnq.set_index(["outcome", "unit"])
    group = rows.loc[("group", cl.UNIT_RECORDS)]
    assert (group["n"], group["records"], group["negative records"]) == (singles, singles // 2, singles // 2)
    assert f"{pairs} records left out: copies disagree" in group["note"] and pd.notna(group["auc"])
    assert (table.loc[table["outcome"] == "group", "note"].str.contains("left out")
            == (table.loc[table["outcome"] == "group", "unit"] == cl.UNIT_RECORDS)).all()
    extraction = rows.loc[("extraction", cl.UNIT_RECORDS)]  # an event: the pair leaked through one copy
    assert (extraction["n"], extraction["records"]) == (singles + pairs, (singles + 2) // 3 + pairs)
    assert pd.isna(extraction["note"])
    texts = rows.loc[("group", cl.UNIT_TEXTS)]  # texts keep every copy, resampled together
    assert (texts["n"], texts["positives"]) == (n, claim.sum())


def test_non_members_from_another_set_never_join_a_members_copy_cluster():
    from gnq_core.analysis import evidence as ev

    members = pd.DataFrame({"example_id": [0, 1, 2], "cluster_id": [0, 0, np.nan], "loss_last": 1.0})
    frame = ev.with_non_members(members, members.copy())  # same ids in their own set: not the same texts
    out = cl.collapse(frame)
    assert out["member"].tolist() == [True, True, False, False] and out["copies"].tolist() == [2, 1, 2, 1]
