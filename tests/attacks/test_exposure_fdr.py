"""'Exposed' at a stated false-alarm rate (attacks/exposure_fdr.py): p-values from ranks,
Benjamini–Hochberg across the run's values, the reference as a likelihood-ratio test.

The run is simulated where the truth is known: a format of 10^4 values (4 free digits), the
reference model's log-likelihood of each, and the audited model's (the reference's plus a
fine-tune's noise, the same for every value it never trained on).  A never-trained value's exact
rank, and its likelihood ratio among never-trained values, are then what the attack measures."""

from __future__ import annotations

import numpy as np
import pytest

from gnq_core.analysis.exposures import expected_false, fdr_sentence
from gnq_core.attacks.exposure_fdr import FDR_Q, RATIO_VALUES, benjamini_hochberg, decide, rank_p, ratio_p

SPACE = 10 ** 4
VALUES = 50
RUNS = 400


def test_benjamini_hochberg_step_up():
    p = [0.001, 0.008, 0.039, 0.041, 0.042, 0.06, 0.074, 0.205, None]
    # by hand at q = 0.05 over the 8 known p-values: the thresholds k q / 8 are 0.00625, 0.0125,
    # 0.01875, 0.025, ...; the largest k with p_(k) under its threshold is 2
    assert benjamini_hochberg(p, 0.05).tolist() == [True, True] + [False] * 7
    assert benjamini_hochberg(p, 0.5).tolist() == [True] * 8 + [False]  # a missing p is never rejected
    assert rank_p(13.287712, 13.287712) == pytest.approx(1e-4)  # rank 1 of 10^4
    assert ratio_p(5.0, [1.0, 2.0, 6.0]) == pytest.approx(2 / 4) and ratio_p(None, [1.0]) is None


def simulated_run(rng: np.random.Generator, memorised: bool):
    """(p-values, likelihood-ratio p-values, index of the memorised value or None) of one run."""
    reference = rng.normal(0, 3, SPACE)                    # log p_ref of every value of the format
    audited = reference + rng.normal(0, 0.5, SPACE)         # a fine-tune that never saw these values
    chosen = rng.choice(SPACE, VALUES + 1 + RATIO_VALUES, replace=False)
    values, null = chosen[: VALUES + 1], chosen[VALUES + 1:]
    if not memorised:
        values = values[:VALUES]
    else:
        audited[values[-1]] = audited.max() + 5.0           # the trained one: the model's favourite
    ordered = np.sort(audited)
    ranks = SPACE - np.searchsorted(ordered, audited[values], side="left")  # 1 + values at least as likely
    bits = np.log2(SPACE) - np.log2(ranks)
    p = [rank_p(b, np.log2(SPACE)) for b in bits]
    ratio = audited - reference
    ref_p = [ratio_p(ratio[v], ratio[null]) for v in values]
    return p, ref_p, (len(values) - 1 if memorised else None)


def test_fifty_never_trained_values_give_at_most_q_false_exposed_and_a_memorised_one_is_found():
    rng = np.random.default_rng(0)
    false, found = [], []
    for _ in range(RUNS):
        p, ref_p, _ = simulated_run(rng, memorised=False)
        false.append(sum(bool(e) for e in decide(p, ref_p, FDR_Q)))
    assert np.mean(false) <= FDR_Q, np.mean(false)
    # the ranks are exact here, so p is uniform: the per-value rule alone (p < 0.01) would flag ~0.5 a run
    for _ in range(40):
        p, ref_p, mine = simulated_run(rng, memorised=True)
        exposed = decide(p, ref_p, FDR_Q)
        found.append(exposed[mine])
    assert all(found)
    # without a reference model BH alone decides, and still finds it
    p, _, mine = simulated_run(rng, memorised=True)
    assert decide(p, None, FDR_Q)[mine] is True


def test_the_reference_test_keeps_a_value_any_model_ranks_first_from_being_exposed():
    """A value the reference ranks as high (public, or easy for any model): its rank p-value is
    tiny, its likelihood ratio ordinary, so it is not exposed by this training."""
    rng = np.random.default_rng(3)
    reference = rng.normal(0, 3, SPACE)
    audited = reference + rng.normal(0, 0.5, SPACE)
    easy = int(np.argmax(reference))
    null = rng.choice(np.delete(np.arange(SPACE), easy), RATIO_VALUES, replace=False)
    p = rank_p(np.log2(SPACE) - np.log2(int((audited >= audited[easy]).sum())), np.log2(SPACE))
    assert p <= 1e-3
    ref = ratio_p(audited[easy] - reference[easy], audited[null] - reference[null])
    assert ref > FDR_Q and decide([p], [ref], FDR_Q) == [False]


def test_the_summary_states_q_and_the_expected_false_alarms():
    said = fdr_sentence({"fdr_q": 0.05, "exposed": 3, "tested": 57, "reference_test": True})
    assert "q = 0.05" in said and "57 measured values" in said and "at most 0.15" in said
    assert "likelihood ratio" in said and expected_false(3, 0.05) == pytest.approx(0.15)
    old = fdr_sentence({"fdr_q": None, "exposed": 1, "tested": 0})
    assert "no false-alarm rate" in old
