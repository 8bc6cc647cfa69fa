"""Memorisation risk from evidence of direction (analysis/risk.py): GNQ and K_jj enter ``risk``
only where the run's own ground truth validates them, in the direction it measures; the calibrated
membership scores and copies enter by default; a run without a reference model or ground truth
is said to be ranked loss-only and uncalibrated."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from gnq_core.analysis.predictive import rank_auc
from gnq_core.analysis.risk import MIN_PER_OUTCOME, RiskBasis, risk_components
from gnq_core.analysis.verdict import rank_texts


def basis_of(frame: pd.DataFrame) -> RiskBasis:
    return RiskBasis.from_dict(frame.attrs["risk"])


def learned(n: int = 300, seed: int = 0) -> pd.DataFrame:
    """Texts a model learned (``truth``) or not, as measured on every run so far: learned texts have
    a lower loss ratio, a higher Min-K%++ and a *smaller* GNQ and gradient norm (each noisy)."""
    rng = np.random.default_rng(seed)
    truth = rng.random(n) < 0.3
    shift = np.where(truth, 1.0, 0.0)
    return pd.DataFrame({
        "example_id": range(n), "text": "t", "n_points": 3, "copies": 1, "gnq_with_copy": 0,
        "gnq_total": np.exp(rng.normal(0, 1, n) - 1.2 * shift),
        "self_influence_last": np.exp(rng.normal(0, 1, n) - 1.2 * shift),
        "loss_last": rng.uniform(0.5, 3.0, n),
        "loss_ratio": np.exp(rng.normal(0, 0.3, n) - 0.3 * shift),
        "min_k_plus": rng.normal(0, 1, n) + 0.8 * shift,
        "truth": truth})


def auc(score: pd.Series, y: pd.Series) -> float:
    return rank_auc(score[y.to_numpy()], score[~y.to_numpy()])


def test_gnq_anticorrelated_with_the_outcome_never_enters_risk_positively():
    frame = learned()
    y = frame["truth"]
    assert auc(frame["gnq_total"], y) < 0.3  # the data: learned texts have smaller GNQ

    # no ground truth: GNQ does not enter at all (shuffling it leaves risk as it was)
    default = risk_components(frame)
    shuffled_gnq = frame["gnq_total"].sample(frac=1, random_state=1).to_numpy()
    shuffled = risk_components(frame.assign(gnq_total=shuffled_gnq))
    pd.testing.assert_series_equal(default["risk"], shuffled["risk"])
    assert default["gnq_sign"].eq(0).all() and basis_of(default).label == "calibrated, not validated"
    assert auc(default["risk"], y) > 0.7  # the calibrated membership scores point the right way

    # the outcome as ground truth (extraction): GNQ enters, reversed, as the outcome measures
    validated = risk_components(frame.assign(extracted=pd.array(y, dtype="boolean")))
    basis = basis_of(validated)
    assert basis.ground_truth == "extraction" and "gnq reversed" in basis.components
    assert "gnq" not in basis.components  # never in the direction the outcome contradicts
    assert (validated["gnq_sign"] == -1).all()
    rho = stats.spearmanr(validated["risk"], frame["gnq_total"]).statistic
    assert rho < 0, rho  # a smaller GNQ raises risk here
    assert auc(validated["risk"], y) > auc(default["risk"], y)  # cross-validated: no text chose its own
    assert "lower = more at risk" in basis.words


def test_a_direction_the_ground_truth_validates_enters_in_that_direction():
    """The same data with GNQ flipped (a run where learned texts had *larger* GNQ): GNQ enters
    as it is, and the reason may call a high GNQ strong evidence."""
    frame = learned(seed=3)
    frame["gnq_total"] = 1.0 / frame["gnq_total"]
    y = frame["truth"]
    validated = risk_components(frame.assign(extracted=pd.array(y, dtype="boolean")))
    basis = basis_of(validated)
    assert "gnq" in basis.components and (validated["gnq_sign"] == 1).all()
    # the out-of-fold AUC stands beside "validated", with its interval, and survives the JSON round trip
    lo, hi = basis.auc_interval
    assert 0.5 < lo < basis.auc < hi <= 1 and "out-of-fold AUC" in basis.shown
    assert f"Out-of-fold AUC of this ranking: {basis.auc:.2f}" in basis.words
    assert RiskBasis.from_dict(basis.to_dict()) == basis
    assert stats.spearmanr(validated["risk"], frame["gnq_total"]).statistic > 0


def membership_frame(frame: pd.DataFrame, rng: np.random.Generator, outside: int = 200) -> pd.DataFrame:
    """The run's texts as members and ``outside`` never-trained texts, measured alike: the
    never-trained texts have a higher gradient norm (K_jj) and loss ratio, and GNQ like the members'."""
    members = frame.assign(member=True)
    others = pd.DataFrame({
        "example_id": len(frame) + np.arange(outside), "text": "u",
        "gnq_total": np.exp(rng.normal(0, 1, outside)),
        "self_influence_last": np.exp(rng.normal(1.5, 1, outside)),
        "loss_last": rng.uniform(0.5, 3.0, outside), "loss_ratio": np.exp(rng.normal(0.2, 0.3, outside)),
        "min_k_plus": rng.normal(0, 1, outside), "member": False})
    cols = ["example_id", "text", "gnq_total", "self_influence_last", "loss_last", "loss_ratio", "min_k_plus",
            "member"]
    out = pd.concat([members[cols], others[cols]], ignore_index=True)
    out["member"] = out["member"].astype("boolean")
    return out


def test_never_trained_texts_choose_the_components():
    """--non-members is ground truth too: K_jj, lower for the run's texts than for never-trained
    ones, enters reversed; the run's extraction outcome has too few records to choose."""
    rng = np.random.default_rng(7)
    frame = learned(200, seed=7)
    frame["self_influence_last"] = np.exp(rng.normal(0, 1, len(frame)))  # members: lower K_jj
    few = np.zeros(len(frame), dtype=bool)
    few[: MIN_PER_OUTCOME - 1] = True
    frame["extracted"] = pd.array(few, dtype="boolean")
    parts = risk_components(frame, membership_frame(frame, rng))
    basis = basis_of(parts)
    assert basis.ground_truth == "membership" and basis.label == "validated on non-members"
    assert "kjj reversed" in basis.components and "kjj" not in basis.components
    assert stats.spearmanr(parts["risk"], frame["self_influence_last"]).statistic < 0
    # without the never-trained texts the same run is not validated, and says why
    alone = basis_of(risk_components(frame))
    assert alone.ground_truth is None and "too weak to choose" in alone.words
    assert f"extraction: {MIN_PER_OUTCOME - 1} positive" in alone.words


def test_without_reference_or_ground_truth_the_ranking_says_loss_only():
    frame = learned().drop(columns=["loss_ratio"])  # no reference model: Min-K%++ alone
    ranked = rank_texts(frame)
    basis = basis_of(ranked)
    assert basis.loss_only and ranked.attrs["risk_label"] == "loss-only, uncalibrated"
    assert "no reference model" in basis.words and "Min-K%++" in basis.words
    at_risk = ranked[ranked["status"] == "at risk"]
    assert len(at_risk) and at_risk["reason"].str.contains("loss-only, uncalibrated").all()
    # copies: a repeated text's risk is at least its repetition's
    with_copies = risk_components(frame.assign(copies=[4] * 8 + [1] * (len(frame) - 8)))
    assert (with_copies["risk"][:8] >= 0.75).all() and "repetition" in basis_of(with_copies).components
