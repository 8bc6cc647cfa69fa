"""The verdict order and its reasons (analysis/verdict.py), and the calibrated membership scores
(attacks/membership.py)."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pandas as pd
import pytest
import torch
from lm_fixtures import tiny_gpt2

from gnq_core.analysis.risk import RiskBasis
from gnq_core.analysis.verdict import COLUMN_HELP, VERDICT_COLUMNS, flag, rank_texts, risk_components
from gnq_core.attacks.membership import membership_scores, min_k_prob, token_logprobs
from gnq_core.engine.math.losses import per_example_lm_loss
from gnq_core.sources.tokens import collate


def totals(**overrides) -> pd.DataFrame:
    """Six texts: a leaked repeated record with a card number, an unleaked PIN note, a unique
    encoded text, a copy of the record, a text the reference also completes, a plain one."""
    frame = pd.DataFrame({
        "example_id": range(6), "text": list("abcdef"), "group": ["x"] * 6,
        "gnq_total": [1.0, 3.0, 10.0, 1.0, 5.0, 0.5], "n_points": 3,
        "copies": [4, 1, 1, 4, 1, 1], "gnq_with_copy": [3, 0, 0, 3, 0, 0],
        "secret": ["card number", "pin", None, "card number", None, None],
        "extracted": pd.array([True, False, False, None, False, False], dtype="boolean"),
        "reproduced": pd.array([True, False, False, None, True, False], dtype="boolean"),
        "extraction_match": [1.0, 0.2, 0.5, None, 1.0, 0.1],
        "reference_match": [0.0, 0.1, 0.1, None, 1.0, 0.0],
        "attack_prefix_tokens": 12, "attack_suffix_tokens": 8,
        "loss_ratio": [0.5, 1.2, 0.2, 0.5, 0.9, 1.0], "zlib_ratio": [0.2, 0.4, 0.1, 0.2, 0.3, 0.5],
        "min_k_prob": [-2.0, -4.0, -1.0, -2.0, -3.0, -5.0]})
    return frame.assign(**overrides)


def test_order_is_leaked_then_secret_then_risk():
    ranked = rank_texts(totals())
    assert list(ranked["example_id"]) == [0, 3, 1, 2, 4, 5]
    assert list(ranked["rank"]) == [1, 2, 3, 4, 5, 6]
    # the card-number record's window came out but its card number was not attacked: the window
    # alone says "text reproduced", never "leaked"
    assert list(ranked["status"][:3]) == ["text reproduced", "secret", "secret"]
    assert ranked["percentile"].iloc[0] == 100.0 and ranked["percentile"].iloc[-1] == pytest.approx(100 / 6)
    assert set(VERDICT_COLUMNS) <= set(ranked.columns)


def test_reasons_say_why_in_words():
    reasons = rank_texts(totals()).set_index("example_id")["reason"]
    assert reasons[0].startswith("text reproduced: its next 8 tokens after the first 12 come out word for "
                                 "word, but its secret-like value was not attacked")
    assert "card-number-like string" in reasons[0]
    assert "repeated 4×: copies explain each other, so GNQ cannot see it" in reasons[3]
    assert reasons[1].startswith("contains a PIN")
    # "encoded" on the loss ratio's word; GNQ is said, not counted (no ground truth here validates it)
    assert reasons[2] == "unique, strong evidence: GNQ in the top 1% and loss 5× below the reference"
    assert reasons[4].startswith("the model completes it, but so does the reference model")
    assert "no strong sign of memorisation" in reasons[5]


def test_risk_ignores_gnq_measured_with_a_copy_and_counts_repetition():
    parts = risk_components(totals())
    assert np.isnan(parts.loc[0, "gnq_percentile_valid"])  # GNQ spoiled by a copy in the batch
    assert parts.loc[0, "repetition"] == pytest.approx(0.75)  # 1 - 1/4
    assert parts.loc[0, "risk"] >= 0.75  # the larger of membership and repetition
    assert parts.loc[2, "risk"] == pytest.approx(1.0)  # unique: its membership alone, not marked down
    apart = risk_components(totals(gnq_with_copy=0))  # copies kept apart: GNQ counts again
    assert apart.loc[0, "gnq_percentile_valid"] == pytest.approx(2.5 / 6)  # ties with its copy: ranks 2, 3
    assert parts["risk"].between(0, 1).all()
    # risk leaves the attack's outcome out: flipping "extracted" changes the order, not the risk
    flipped = risk_components(totals(extracted=pd.array([False] * 6, dtype="boolean")))
    pd.testing.assert_series_equal(flipped["risk"], parts["risk"])


def test_without_any_evidence_gnq_does_not_order_the_texts():
    """GNQ alone is no evidence of memorisation (learned texts had smaller GNQ on every run measured):
    with nothing else measured, no text is "at risk" and the basis says there is no evidence."""
    bare = totals()[["example_id", "text", "group", "gnq_total", "n_points"]]
    ranked = rank_texts(bare)
    assert list(ranked["example_id"]) == list(range(6)) and (ranked["risk"] == 0).all()
    assert set(ranked["status"]) == {"low"} and ranked.attrs["risk_label"] == "no evidence"
    assert rank_texts(bare.iloc[0:0]).empty
    # with the loss alone: loss-only and uncalibrated, said so
    lossy = rank_texts(bare.assign(loss_last=[3.0, 2.0, 0.5, 3.0, 1.0, 4.0]))
    assert list(lossy["example_id"][:2]) == [2, 4] and lossy.attrs["risk_label"] == "loss-only, uncalibrated"
    assert RiskBasis.from_dict(lossy.attrs["risk"]).loss_only
    assert "no reference model" in lossy.attrs["risk_basis"]
    at_risk = lossy[lossy["status"] == "at risk"]
    assert len(at_risk) and at_risk["reason"].str.contains("loss-only, uncalibrated").all()


def test_flag_filters_combine():
    ranked = rank_texts(totals())
    assert list(flag(ranked, top=2)["example_id"]) == [0, 3]
    assert list(flag(ranked, min_percentile=60)["example_id"]) == [0, 3, 1]
    assert list(flag(ranked, min_gnq=3.0, top=4)["example_id"]) == [1, 2]


def test_every_verdict_column_has_help():
    for column in VERDICT_COLUMNS + ["gnq_total", "copies", "secret", "extracted", "loss_ratio", "zlib_ratio",
                                     "min_k_prob", "reference_match", "gnq_with_copy", "self_influence_last",
                                     "loss_last", "secret_exposure", "secret_exposure_value",
                                     "secret_reference_exposure", "secret_exposure_null_p99"]:
        if column != "verdict_score":
            assert COLUMN_HELP[column]


# ------------------------------------------------------------------------------ membership scores
def test_token_logprobs_give_the_per_example_loss():
    torch.manual_seed(0)
    model = tiny_gpt2().double()
    ids = [[5, 9, 3, 7, 7, 2], [4, 8], [6, 1, 2, 3]]
    lps = token_logprobs(model, ids, pad=0, batch_size=2)
    b = collate(ids, [0, 1, 2], 0)
    with torch.no_grad():
        losses = per_example_lm_loss(model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits,
                                     b.labels)
    assert [len(x) for x in lps] == [5, 1, 3]
    np.testing.assert_allclose([-x.mean() for x in lps], losses.numpy(), rtol=1e-10)


def test_scores_follow_their_definitions():
    lp = np.log(np.array([0.5, 0.25, 0.9, 0.01, 0.8]))
    assert min_k_prob(lp, 0.2) == pytest.approx(math.log(0.01))  # ceil(0.2 * 5) = 1 token
    assert min_k_prob(lp, 0.4) == pytest.approx((math.log(0.01) + math.log(0.25)) / 2)
    assert math.isnan(min_k_prob(np.array([])))
    text = "some text to compress"
    ref = lp - 1.0
    scores = membership_scores([text], [lp], [ref]).iloc[0]
    assert scores["attack_loss"] == pytest.approx(-lp.mean())
    assert scores["loss_ratio"] == pytest.approx(lp.mean() / ref.mean())
    zlib_bits = 8 * len(zlib.compress(text.encode()))
    assert scores["zlib_ratio"] == pytest.approx(-lp.sum() / math.log(2) / zlib_bits)
    no_ref = membership_scores([text], [lp], None).iloc[0]
    assert math.isnan(no_ref["loss_ratio"]) and no_ref["min_k_prob"] == scores["min_k_prob"]


# --------------------------------------------------- GNQ in the risk only where evidence backs it
def _many(n: int = 200, seed: int = 0) -> pd.DataFrame:
    """Texts whose extraction follows low loss only; GNQ is noise, membership scores are absent."""
    rng = np.random.default_rng(seed)
    loss = rng.uniform(0.1, 3.0, n)
    return pd.DataFrame({
        "example_id": range(n), "text": "t", "gnq_total": rng.uniform(1, 100, n), "n_points": 3, "copies": 1,
        "gnq_with_copy": 0, "loss_last": loss, "attack_prefix_tokens": 12, "attack_suffix_tokens": 8,
        "extracted": pd.array(rng.random(n) < 1 / (1 + np.exp(4 * (loss - 1.0))), dtype="boolean"),
        # membership evidence that points to some texts without GNQ or the loss ratio agreeing
        "zlib_ratio": rng.uniform(0.1, 1.0, n), "min_k_prob": rng.uniform(-6, -1, n),
        "loss_ratio": rng.uniform(0.7, 1.3, n)})


def test_status_and_reason_never_contradict():
    """'at risk' beside 'no strong sign of memorisation' was possible: risk can be in the top 20% by
    the calibrated membership scores while GNQ is mid-range and the loss ratio near 1."""
    frame = _many().drop(columns=["extracted"])  # no ground truth: the default risk
    ranked = rank_texts(frame)
    at_risk = ranked[ranked["status"] == "at risk"]
    assert len(at_risk) > 0
    assert not at_risk["reason"].str.contains("no strong sign").any()
    assert at_risk["reason"].str.contains("top").all()  # top 20% by risk, or GNQ / loss in words
    low = ranked[ranked["status"] == "low"]
    assert not low["reason"].str.contains("unique, strong evidence").any()
    assert not low["reason"].str.contains("memorisation risk in this run's top").any()


def test_risk_uses_the_components_that_validate_on_the_runs_outcome():
    frame = _many(300)
    ranked = rank_texts(frame)
    basis = ranked.attrs["risk_basis"]
    assert basis.startswith("validated on this run's extraction outcome") and "low loss" in basis
    assert "exposure" not in basis  # GNQ is noise here: it does not validate
    y = ranked["extracted"].astype(bool)
    auc = (ranked["risk"][y].to_numpy()[:, None] > ranked["risk"][~y].to_numpy()[None, :]).mean()
    assert auc > 0.8  # cross-validated risk follows the outcome; the default (GNQ + membership) does not
    default = risk_components(frame.drop(columns=["extracted"]))["risk"]
    assert (default[y].to_numpy()[:, None] > default[~y].to_numpy()[None, :]).mean() < 0.65
    few = frame.assign(extracted=pd.array([True] * 3 + [False] * 297, dtype="boolean"))
    assert risk_components(few)["risk_basis"].iloc[0].startswith("default")
