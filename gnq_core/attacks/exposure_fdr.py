"""Which of a run's secret values are *exposed*, at a stated false-alarm rate.

* **A p-value per value**: under the null (the model never trained on the value) its rank is
  uniform over its space, so P(rank ≤ r) = r / |space| = 2^−exposure: an exact rank's p-value.  An
  estimated rank's p-value is read at the estimate's upper 95% bound (``Exposure.p_value``: the
  importance-sampling estimate of the rank plus 1.645 standard errors, over |space|), so the
  estimate's own noise cannot make a value look rarer than it is.
* **Benjamini–Hochberg** across every value the run measured (all kinds and formats together)
  at ``FDR_Q``: among the values called exposed, the expected share of false alarms is at most q,
  so the expected number of false "exposed" values is at most q × (the number called exposed).
* **The reference as a likelihood-ratio test**, where the run has a reference model: the value's
  log-likelihood ratio, audited − reference, after its own prompt, against the same ratio of
  ``RATIO_VALUES`` never-trained values of its format (scored by both models after the format's
  values' prompts).  Under the null the value is one more never-trained value, so the share of
  them with a ratio at least its own, (1 + k) / (1 + n), is a p-value; a value whose likelihood
  the reference gives as well (public, or easy for any model) is not exposed by this training.
  Exposed = BH rejects it *and* that p-value is at most q (an intersection of two tests: neither
  error rate grows).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

FDR_Q = 0.05         # the false-discovery rate "exposed" is controlled at (recorded with each row)
RATIO_VALUES = 200   # never-trained values per format whose likelihood ratio is the reference test's null
UPPER_Z = 1.645      # an estimated rank's p-value: at its one-sided 95% upper bound


def rank_p(bits: float | None, space_bits: float | None) -> float | None:
    """An exact rank's p-value: rank / |space| = 2^−exposure (None when not measured)."""
    if bits is None or space_bits is None or not math.isfinite(bits):
        return None
    return float(min(1.0, 2.0 ** -float(bits)))


def benjamini_hochberg(p_values: Sequence[float | None], q: float = FDR_Q) -> np.ndarray:
    """Per p-value, whether the Benjamini–Hochberg step-up rejects it at false-discovery rate
    ``q`` (scipy's adjusted p-values at most q); a missing p-value is never rejected and does not
    count among the tests."""
    from scipy.stats import false_discovery_control

    p = np.array([np.nan if v is None else float(v) for v in p_values], dtype=float)
    out = np.zeros(len(p), dtype=bool)
    known = np.flatnonzero(np.isfinite(p))
    if len(known):
        out[known] = false_discovery_control(p[known], method="bh") <= q
    return out


def ratio_p(value_ratio: float | None, null_ratios: Sequence[float]) -> float | None:
    """The likelihood-ratio test's p-value (module docstring): (1 + k) / (1 + n), k of the ``n``
    never-trained values' ratios at least the value's; None without a ratio or a null."""
    null = np.asarray([r for r in null_ratios if r is not None and math.isfinite(r)], dtype=float)
    if value_ratio is None or not math.isfinite(value_ratio) or not len(null):
        return None
    return float((1 + int((null >= value_ratio).sum())) / (1 + len(null)))


def decide(p_values: Sequence[float | None], reference_p: Sequence[float | None] | None,
           q: float = FDR_Q) -> list[bool | None]:
    """Exposed per value (module docstring): BH at ``q`` over ``p_values`` and, with a reference
    (``reference_p`` not None), the likelihood-ratio p-value at most ``q``; None where the value
    has no p-value (not measured), or no ratio p-value although the run has a reference."""
    bh = benjamini_hochberg(p_values, q)
    out: list[bool | None] = []
    for i, p in enumerate(p_values):
        ref = None if reference_p is None else reference_p[i]
        if p is None or (reference_p is not None and ref is None):
            out.append(None)
        else:
            out.append(bool(bh[i] and (reference_p is None or ref <= q)))
    return out

