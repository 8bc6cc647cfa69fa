"""Exposure of values with no uniform space (e-mails, names, addresses), relative to a reference
model (attacks/exposure_relative.py): the share of what the reference model writes after the
same prompt whose likelihood ratio audited/reference is at least the value's.

A tiny GPT-2 "base" is trained from scratch on filler and on records holding one shared public
address (help@...); the "fine-tune" continues from it on the same data plus a record holding a
private address at 8 copies.  Audited with the base as the reference: the private address is
exposed, far above the never-trained addresses' null; never-trained addresses in the audited
texts are not; the public address, which the fine-tune writes as readily as the base, is not
exposed for being common."""

from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import pytest
import torch
from test_exposure import FILLER, NAMES, _train

from gnq_core.attacks.exposure import PromptScorer
from gnq_core.attacks.exposure_relative import (
    ReferenceDraws,
    draw_reference,
    relative_bits,
    relative_exposure,
)
from gnq_core.attacks.secret_attack import attack_secrets
from gnq_core.catalog import RELATIVE_TEMPLATE
from gnq_core.sources.models import build_model, train_tokenizer

TEMPLATE = "Contact of {}: write to {} today."
PUBLIC = "help.desk@example.com"
PRIVATE = "alice.wong@mailbox.org"
UNSEEN = ["bruno.kahl@postfach.de", "mira.sol@inbox.net", "tess.lund@webmail.se", "omar.fadel@correo.es"]


def _draws(ratios) -> ReferenceDraws:
    return ReferenceDraws([(i,) for i in range(len(ratios))], np.asarray(ratios, dtype=float))


def test_the_share_is_the_reference_draws_at_least_as_high_and_markov_bounds_it():
    draws = _draws([-3.0, -1.0, 0.0, 0.5, 2.0, -0.5, 1.0, -2.0, 0.2])  # 9 draws
    bits, mc, k = relative_bits(0.4, draws)
    assert k == 3 and mc == pytest.approx(4 / 10) and bits == pytest.approx(-math.log2(0.4))
    # above every draw: the Monte Carlo share stops at 1/(n+1), Markov's e^-ratio goes on
    bits, mc, k = relative_bits(30.0, draws)
    assert k == 0 and mc == pytest.approx(0.1) and bits == pytest.approx(30.0 / math.log(2))
    e = relative_exposure(30.0, draws)
    assert e.method == "estimated" and e.rank is None and e.p_value == pytest.approx(2 * math.exp(-30.0))
    assert "Markov" in e.fit and "0 of 9" in e.fit
    assert relative_exposure(-10.0, draws).bits == 0.0 and relative_exposure(-10.0, draws).p_value == 1.0
    assert relative_exposure(float("nan"), draws).bits is None


def test_a_value_the_reference_writes_has_a_uniform_share_under_the_null():
    """Draws of the reference, measured against other draws of it, are exchangeable with them: the
    share is a valid p-value (P(p <= a) <= a) whatever the audited model is."""
    torch.manual_seed(0)
    audited = build_model("tiny", 64, 32, seed=1).eval()
    reference = build_model("tiny", 64, 32, seed=2).eval()
    prompt = [5, 9, 11]
    a, r = PromptScorer(audited, prompt, 64), PromptScorer(reference, prompt, 64)
    compared = draw_reference(r, a, 3, 40, seed=3)
    fresh = draw_reference(r, a, 3, 400, seed=4)
    p = np.array([relative_exposure(float(x), compared).p_value for x in fresh.log_ratios])
    for level in (0.1, 0.25, 0.5):
        assert (p <= level).mean() <= level + 3 * math.sqrt(level / len(p))
    # and the two models differ, so the ratios are not all tied
    assert compared.log_ratios.std() > 0.01


@pytest.mark.slow
def test_a_memorised_address_is_exposed_a_common_one_and_never_trained_ones_are_not():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        torch.manual_seed(0)
        public = [TEMPLATE.format(NAMES[i % len(NAMES)], PUBLIC) for i in range(24)]
        record = TEMPLATE.format(NAMES[0], PRIVATE)
        tok = train_tokenizer(FILLER + public + [record] + [TEMPLATE.format(n, u) for n, u in
                                                            zip(NAMES[1:], UNSEEN, strict=False)], 420)
        base = _train(FILLER + public, tok, epochs=30)
        tuned = _train(FILLER + public + [record] * 8, tok, epochs=30, model=copy.deepcopy(base))
        audited = ([record] * 8 + [TEMPLATE.format(NAMES[3 + i], u) for i, u in enumerate(UNSEEN)]
                   + public[:2])
        ids = [tok(t, add_special_tokens=False)["input_ids"] for t in audited]
        got = attack_secrets(tuned, tok, audited, list(range(len(audited))), ids, reference=base,
                             n_candidates=64, seed=7, max_length=64)
    finally:
        torch.set_default_dtype(previous)
    rows = got.rows[got.rows["kind"] == "email"].groupby("value").first()
    assert set(rows.index) == {PRIVATE, PUBLIC, *UNSEEN}
    assert (rows["exposure_template"] == RELATIVE_TEMPLATE).all() and rows["exposure_space_bits"].isna().all()
    assert (rows["exposure_method"] == "estimated").all()
    null = got.null[got.null["kind"] == "email"]
    assert len(null) == 20 and not null["value"].isin([PRIVATE, PUBLIC, *UNSEEN]).any()
    assert null["value"].str.endswith(tuple("@" + v.split("@")[1] for v in (PRIVATE, PUBLIC, *UNSEEN))).all()
    p99 = float(rows["exposure_null_p99"].iloc[0])
    private = rows.loc[PRIVATE]
    assert private["value_copies"] == 8 and bool(private["exposed"]) and private["exposure"] > p99 + 5
    assert float(private["log_ratio"]) > 5 and float(private["reference_ratio_p"]) <= 0.05
    assert not rows.loc[UNSEEN, "exposed"].any()
    assert not bool(rows.loc[PUBLIC, "exposed"])
    # the fine-tune writes the public address as readily as the base: its ratio is no training's
    assert abs(float(rows.loc[PUBLIC, "log_ratio"])) < float(private["log_ratio"]) / 4


def test_without_a_reference_such_values_get_no_exposure():
    tok = train_tokenizer(FILLER + [TEMPLATE.format(NAMES[0], PRIVATE)], 420)
    model = build_model("tiny", len(tok), 64, seed=0).eval()
    texts = [TEMPLATE.format(NAMES[0], PRIVATE)]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    got = attack_secrets(model, tok, texts, [0], ids, n_candidates=16, max_length=64)
    row = got.rows[got.rows["kind"] == "email"].iloc[0]
    assert pd.isna(row["exposure"]) and pd.isna(row["exposure_template"])
    assert got.null.empty
