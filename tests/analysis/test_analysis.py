"""gnq_core.analysis.summaries on hand-made frames: numbers that can be checked by eye."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from gnq_core.analysis.summaries import (
    ALIGNMENT_COLUMNS,
    NEAREST_COLUMNS,
    QUANTILE_BIN_COLUMNS,
    SEPARATION_COLUMNS,
    TARGETED_COLUMNS,
    group_auc,
    group_separation,
    nearest_by_trajectory,
    quantile_bins,
    targeted_attack_table,
    token_alignment,
    top_bottom,
)


def totals_frame(n: int = 100, extracted_top: int = 10) -> pd.DataFrame:
    """n examples, GNQ_total = 10^(id/10) rising with the id; the top ``extracted_top`` by GNQ are
    extracted (match 1.0), the rest not (match 0.5).  Loss falls with the id except that it is
    *highest* for the extracted ones (so a loss pick finds none of them)."""
    ids = np.arange(n)
    gnq = 10 ** (ids / 10)
    extracted = ids >= n - extracted_top
    loss = np.where(extracted, 10.0 + ids, 5.0 - ids / n)
    return pd.DataFrame({
        "example_id": ids, "text": [f"text {i}" for i in ids],
        "group": np.where(ids % 2 == 0, "even", "odd"), "gnq_total": gnq, "loss_last": loss,
        "self_influence_last": gnq[::-1].copy(), "extraction_match": np.where(extracted, 1.0, 0.5)})


# --------------------------------------------------------------------------- quantile_bins
def test_quantile_bins_counts_and_rates():
    t = totals_frame(100, extracted_top=10)
    b = quantile_bins(t, bins=10)
    assert list(b.columns) == QUANTILE_BIN_COLUMNS
    assert b["bin"].tolist() == list(range(1, 11))
    assert b["n"].tolist() == [10] * 10
    assert b["success_rate"].tolist() == [0.0] * 9 + [1.0]
    assert b["mean_match"].tolist() == pytest.approx([0.5] * 9 + [1.0])
    assert (b["lo"] <= b["hi"]).all() and (b["hi"].iloc[:-1].to_numpy() < b["lo"].iloc[1:].to_numpy()).all()
    assert b["example_ids"].iloc[-1] == list(range(90, 100))
    # A lower threshold counts the partial matches too.
    assert quantile_bins(t, bins=10, threshold=0.5)["success_rate"].tolist() == [1.0] * 10


def test_quantile_bins_ties_nulls_and_few_rows():
    t = pd.DataFrame({"example_id": range(8), "gnq_total": [1.0] * 6 + [np.nan, 2.0],
                      "extraction_match": [1, 0, 1, 0, 1, 0, 1, None]})
    b = quantile_bins(t, bins=3)           # all six usable rows tie: rank-based bins still work
    assert b["n"].sum() == 6 and len(b) == 3 and b["n"].tolist() == [2, 2, 2]
    assert b["mean_score"].tolist() == [1.0, 1.0, 1.0]
    few = quantile_bins(t.iloc[:3], bins=10)  # fewer rows than bins: one row per bin
    assert few["n"].tolist() == [1, 1, 1]
    assert quantile_bins(t, bins=4, score="gnq_max").empty  # missing score column


def test_quantile_bins_empty():
    assert quantile_bins(pd.DataFrame()).empty
    out = quantile_bins(totals_frame().assign(extraction_match=np.nan))
    assert out.empty and list(out.columns) == QUANTILE_BIN_COLUMNS


# --------------------------------------------------------------------------- targeted attack
def test_targeted_table_gnq_predicts_extraction():
    t = totals_frame(100, extracted_top=10)
    tab = targeted_attack_table(t, seeds=20, seed=1)
    assert list(tab.columns) == TARGETED_COLUMNS
    assert tab["k"].tolist() == [5, 10, 20]
    assert tab["by_gnq"].tolist() == [1.0, 1.0, 0.5]
    assert tab["by_gnq_count"].tolist() == [5, 10, 10]
    assert tab["by_loss"].tolist() == [0.0, 0.0, 0.0]       # lowest loss first misses them all
    assert tab["by_self_influence"].tolist() == [0.0, 0.0, 0.0]
    assert tab["base_rate"].tolist() == [0.1] * 3
    assert ((tab["random_mean"] - 0.1).abs() < 0.1).all()
    assert (tab["random_std"] >= 0).all()
    assert tab["by_gnq_groups"].iloc[1] == "even=5, odd=5"
    # Deterministic for a seed.
    pd.testing.assert_frame_equal(tab, targeted_attack_table(t, seeds=20, seed=1))


def test_targeted_table_random_is_near_base_rate():
    rng = np.random.default_rng(0)
    t = totals_frame(1000).assign(extraction_match=(rng.random(1000) < 0.3).astype(float))
    tab = targeted_attack_table(t, fractions=(0.2,), seeds=50)
    assert abs(tab["random_mean"].iloc[0] - tab["base_rate"].iloc[0]) < 0.03


def test_targeted_table_small_and_missing_columns():
    t = totals_frame(5).drop(columns=["self_influence_last"])
    tab = targeted_attack_table(t, fractions=(0.01, 1.0, 2.0))
    assert tab["k"].tolist() == [1, 5, 5]                   # k >= 1 and never more than n
    assert math.isnan(tab["by_self_influence"].iloc[0])
    assert tab["by_gnq"].tolist() == [1.0, 1.0, 1.0]       # all five are "extracted" (top 10 of 5)


def test_targeted_table_empty():
    assert targeted_attack_table(pd.DataFrame()).empty
    out = targeted_attack_table(totals_frame().assign(extraction_match=None))
    assert out.empty and list(out.columns) == TARGETED_COLUMNS


# --------------------------------------------------------------------------- AUC
def test_group_auc_cases():
    groups = ["a", "a", "b", "b"]
    assert group_auc([3, 4, 1, 2], groups, "a", "b") == 1.0
    assert group_auc([1, 2, 3, 4], groups, "a", "b") == 0.0
    assert group_auc([1, 1, 1, 1], groups, "a", "b") == 0.5          # all ties
    assert group_auc([1, 4, 2, 3], groups, "a", "b") == 0.5
    assert group_auc([2, 3, 2, 1], groups, "a", "b") == pytest.approx(0.875)  # one tie counts ½
    assert group_auc([2, np.nan, 1, 3], groups, "a", "b") == 0.5    # NaN ignored
    assert math.isnan(group_auc([1, 2], ["a", "a"], "a", "b"))
    assert math.isnan(group_auc([], [], "a", "b"))
    with pytest.raises(ValueError):
        group_auc([1, 2], ["a"], "a", "b")


def test_group_separation_per_point():
    traj = pd.DataFrame({
        "example_id": [0, 1, 2, 3] * 2, "point": [0] * 4 + [1] * 4, "label": ["e1"] * 4 + ["e2"] * 4,
        "gnq": [1, 1, 1, 1, 10, 20, 1, 2], "group": ["false", "false", "true", "true"] * 2})
    sep = group_separation(traj, "false", "true")
    assert list(sep.columns) == SEPARATION_COLUMNS
    assert sep["label"].tolist() == ["e1", "e2"]
    assert sep["auc"].tolist() == [0.5, 1.0]
    assert sep["median_positive"].tolist() == [1.0, 15.0]
    assert sep["n_negative"].tolist() == [2, 2]
    assert group_separation(traj.iloc[0:0], "false", "true").empty


# --------------------------------------------------------------------------- nearest
def test_nearest_finds_the_twin():
    rows = []
    shapes = {0: [1, 2, 3, 4], 1: [1.1, 2.1, 3.05, 4.0], 2: [4, 3, 2, 1], 3: [2, 2, 2, 2], 4: [1, 2, 3, 4]}
    for eid, logs in shapes.items():
        for p, v in enumerate(logs):
            rows.append({"example_id": eid, "point": p, "gnq": 10.0 ** v})
    traj = pd.DataFrame(rows)
    near = nearest_by_trajectory(traj, 0, k=3)
    assert list(near.columns) == NEAREST_COLUMNS
    assert near["example_id"].tolist() == [4, 1, 3]
    assert near["distance"].iloc[0] == pytest.approx(0.0)
    assert 0 not in near["example_id"].tolist()
    assert nearest_by_trajectory(traj, 99).empty
    assert nearest_by_trajectory(traj.iloc[0:0], 0).empty


def test_nearest_with_missing_points():
    traj = pd.DataFrame({"example_id": [0, 0, 1, 2, 2], "point": [0, 1, 0, 0, 1],
                         "gnq": [10.0, 100.0, 10.0, 1000.0, 0.0]})  # 0.0 cannot be logged
    near = nearest_by_trajectory(traj, 0)
    assert near["example_id"].tolist() == [1, 2]
    assert near["distance"].tolist() == pytest.approx([0.0, 2 * math.sqrt(2)])


# --------------------------------------------------------------------------- alignment, top/bottom
def test_token_alignment():
    a = token_alignment(["The", " cat", " sat"], ["The", " dog", " sat"])
    assert list(a.columns) == ALIGNMENT_COLUMNS
    assert a["match"].tolist() == [True, False, True]
    assert a["position"].tolist() == [0, 1, 2]
    padded = token_alignment(["a", "b"], ["a"])
    assert padded["generated"].tolist() == ["a", ""] and padded["match"].tolist() == [True, False]
    assert token_alignment([], []).empty


def test_top_bottom():
    t = totals_frame(10)
    top, bottom = top_bottom(t, k=2)
    assert top["example_id"].tolist() == [9, 8]
    assert bottom["example_id"].tolist() == [0, 1]
    top, bottom = top_bottom(t.iloc[:3], k=2)               # overlap: bottom gets what is left
    assert top["example_id"].tolist() == [2, 1] and bottom["example_id"].tolist() == [0]
    with_nan = t.assign(gnq_total=[np.nan] + t["gnq_total"].iloc[1:].tolist())
    assert top_bottom(with_nan, k=1)[1]["example_id"].tolist() == [1]
    empty_top, empty_bottom = top_bottom(pd.DataFrame())
    assert empty_top.empty and empty_bottom.empty
