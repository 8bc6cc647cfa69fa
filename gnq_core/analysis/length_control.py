"""Does a signal say more than text length (and loss)?  Pure functions of arrays.

Two controls, shared by the dashboard, ``gnq report`` (HTML and JSON) and the studies:

* **AUC within exact token length, pair-weighted** (``within_length_auc``).  Only pairs of one
  positive and one negative text *of the same token length* are compared, so a signal that is a
  function of length alone scores exactly 0.5 (ties count ½).  Equivalently: each length stratum's
  AUC weighted by its number of positive×negative pairs.  A length whose texts share one outcome
  holds no pair and adds nothing.  ``merge=True`` merges such a length with the next longer
  one(s) until the stratum holds both outcomes, an option asked for in review; it is not the default
  because the merged pairs compare texts of different lengths again: on the demo run (8
  extracted texts, all of length 31 or 35) it left 2 strata spanning 14–45 tokens, in which text
  length itself scored 0.21 instead of 0.5.  The earlier control (3 quantile bins, unweighted
  mean over bins) left length free to predict inside a bin: a length-only signal scored
  0.66-0.86 there.
* **Cross-validated gain over length + loss + log copies** (``cv_gain``): the out-of-fold AUC of
  a logistic regression on [length spline, loss, log copies, signal] minus that of [length spline,
  loss, log copies] (for loss itself: without loss; for the copy count itself: without it).  The
  copy count is in the base because the tool already has it and a text with m copies among its
  batch companions has GNQ ≤ about 1/m: without it, a GNQ "gain" can be duplicate counting.
  Folds stratified by outcome, grouped by copy cluster
  (StratifiedGroupKFold: a record's copies never straddle training and test) and seeded; the
  interval resamples copy clusters of the out-of-fold predictions (stratified, paired: both
  models on the same resample), so it reflects the records, not refitting; the likelihood-ratio
  p compares the two models fitted on records (copies collapsed: the test assumes independent
  observations; χ², one degree of freedom).  Null simulations shaped like the demo
  (tests/analysis/test_calibration.py) keep both the interval's claims and p < 0.05 under 7%.  Positive
  gain with its interval above 0: the signal carries information about the outcome that length,
  loss and the copy count do not.

The within-length control is defined beside the bootstrap it shares (``predictive``, whose
stratified table reports it).  scikit-learn is imported only inside
``cv_gain`` (seconds on a busy machine; pages that do not need it stay quick).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from gnq_core.analysis.clusters import effective_records, records, too_few
from gnq_core.analysis.predictive import LEVEL, RESAMPLES, bootstrap, interval, metrics_matrix

FOLDS = 5
SPLINE_KNOTS = 5


# ------------------------------------------------------------------------------ CV gain
@dataclass(frozen=True)
class Gain:
    gain: float       # CV AUC(base + signal) − CV AUC(base); NaN: too few texts
    lo: float
    hi: float
    auc_base: float   # out-of-fold AUC of the base model
    auc_full: float
    lr_p: float       # likelihood-ratio p of adding the signal (all texts)
    n: int
    base: str         # what the base model holds, in words
    note: str = ""    # why not computed, when NaN


def _design(lengths: np.ndarray, extra: list[np.ndarray]) -> np.ndarray:
    """The model's columns: a cubic B-spline basis of the length (uniform knots over its range;
    none when the length does not vary) and the standardised extras.  Both transforms ignore the
    outcome, so fitting them on all texts leaks nothing into the folds."""
    from sklearn.preprocessing import SplineTransformer

    columns = []
    if len(np.unique(lengths)) > 1:
        knots = int(min(SPLINE_KNOTS, len(np.unique(lengths))))
        columns.append(SplineTransformer(n_knots=knots, degree=3).fit_transform(lengths[:, None]))
    for v in extra:
        sd = v.std()
        if sd > 0:  # a constant (every text unique: log copies 0) says nothing
            columns.append(((v - v.mean()) / sd)[:, None])
    return np.hstack(columns) if columns else np.zeros((len(lengths), 0))


def _model():
    from sklearn.linear_model import LogisticRegression

    # Barely penalised: the spline's few columns and one or two scores do not overfit at the
    # sizes scored here, and a strong penalty would shrink the gain toward 0 by itself.
    return LogisticRegression(C=1e4, max_iter=2000)


def _out_of_fold(x: np.ndarray, y: np.ndarray, seed: int, groups: np.ndarray | None = None) -> np.ndarray:
    """Out-of-fold predicted log-odds of one model on ``x``; folds stratified by outcome and, with
    ``groups``, grouped by copy cluster (scikit-learn's StratifiedGroupKFold: the copies of a
    record are never split between training and test)."""
    from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold

    if x.shape[1] == 0:  # nothing varies: the base rate
        return np.zeros(len(y))
    pred = np.zeros(len(y))
    splitter = (StratifiedKFold(FOLDS, shuffle=True, random_state=seed) if groups is None
                else StratifiedGroupKFold(FOLDS, shuffle=True, random_state=seed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter under (near) separation; uneven group folds
        for train, test in splitter.split(x, y, groups):
            pred[test] = _model().fit(x[train], y[train]).decision_function(x[test])
    return pred


def _log_likelihood(x: np.ndarray, y: np.ndarray) -> float:
    """The log-likelihood of the model on ``x`` fitted to all of ``x`` (the base rate without columns)."""
    if x.shape[1] == 0:
        p = y.mean()
        return float(len(y) * (p * math.log(p) + (1 - p) * math.log(1 - p)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = _model().fit(x, y)
    prob = np.clip(full.predict_proba(x)[:, 1], 1e-12, 1 - 1e-12)
    return float(np.sum(np.where(y, np.log(prob), np.log(1 - prob))))


def _by_record(groups: np.ndarray | None, *columns: np.ndarray) -> tuple[np.ndarray, ...]:
    """The columns with copies collapsed to one record (mean; the outcome, a bool column: any)."""
    if groups is None:
        return columns
    _, codes = np.unique(groups, return_inverse=True)
    codes = codes.ravel()
    counts = np.bincount(codes).astype(float)
    out = []
    for c in columns:
        if c.dtype == bool:
            hit = np.zeros(len(counts), dtype=bool)
            np.logical_or.at(hit, codes, c)
            out.append(hit)
        else:
            out.append(np.bincount(codes, weights=c) / counts)
    return tuple(out)


def lr_p(scores: np.ndarray, labels: np.ndarray, lengths: np.ndarray, base_extra: list[np.ndarray],
         groups: np.ndarray | None = None) -> float:
    """Likelihood-ratio p of adding ``scores`` to [length spline, ``base_extra``] (χ², 1 df), fitted
    on records: copies collapsed to one (mean values, positive when any copy is), because the test
    assumes independent observations and copies are not."""
    from scipy.stats import chi2

    s, y, n_len, *extra = _by_record(groups, scores, labels, lengths, *base_extra)
    ll_base = _log_likelihood(_design(n_len, list(extra)), y)
    ll_full = _log_likelihood(_design(n_len, [*extra, s]), y)
    return float(chi2.sf(max(0.0, 2 * (ll_full - ll_base)), df=1))


def cv_gain(scores: np.ndarray, labels: np.ndarray, lengths: np.ndarray, loss: np.ndarray | None, *,
            resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL,
            signal_is_loss: bool = False, cache: dict | None = None, groups: np.ndarray | None = None,
            min_records: int = 0, copies: np.ndarray | None = None,
            covariates: dict[str, np.ndarray] | None = None) -> Gain:
    """The cross-validated AUC gain of ``scores`` over [length spline + ``loss`` + log ``copies``]
    (see the module docstring), on the texts where score, length, outcome (and loss, copies) are
    all known.  ``signal_is_loss``: no loss in the base; ``copies`` None (the signal is the copy
    count, or no copy detection ran): no copy count in the base.  ``covariates``: more base columns
    by name (e.g. K_jj, so that a GNQ gain is what the gradient norm does not already say).
    ``cache``: a dict shared by calls on the same texts (the base model is fitted once per set of
    texts scored).  ``groups`` (copy clusters): folds grouped by cluster, the interval a cluster
    bootstrap expanded for the effective number of records, the LR test on records; fewer than
    ``min_records`` positive or negative records: no number, ``note`` says why."""
    s, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    n_len = np.asarray(lengths, dtype=float)
    use_loss = loss is not None and not signal_is_loss
    lo_ = np.asarray(loss, dtype=float) if use_loss else np.zeros(len(s))
    log_c = np.log(np.asarray(copies, dtype=float)) if copies is not None else np.zeros(len(s))
    more = {k: np.asarray(v, dtype=float) for k, v in (covariates or {}).items()}
    keep = np.isfinite(s) & np.isfinite(n_len) & np.isfinite(lo_) & np.isfinite(log_c)
    for v in more.values():
        keep &= np.isfinite(v)
    g = None if groups is None else np.asarray(groups)[keep]
    s, y, n_len, lo_, log_c = s[keep], y[keep], n_len[keep], lo_[keep], log_c[keep]
    more = {k: v[keep] for k, v in more.items()}
    base = " + ".join(["length spline", *(["loss"] if use_loss else []),
                       *(["log copies"] if copies is not None else []), *more])
    n = len(y)
    pos, neg = records(y, g)
    if min(pos, neg) < FOLDS:
        note = f"needs at least {FOLDS} independent records of each outcome (has {pos} and {neg})"
    else:
        note = too_few(y, g, min_records) if min_records else ""
    if note:
        return Gain(*(math.nan,) * 6, n, base, note=note)
    base_extra = ([lo_] if use_loss else []) + ([log_c] if copies is not None else []) + list(more.values())
    key = (keep.tobytes(), y.tobytes(), None if g is None else g.tobytes(), use_loss, copies is not None,
           tuple(more), seed, resamples)
    if cache is not None and key in cache:
        pred_base, auc_base, b_base = cache[key]
    else:
        pred_base = _out_of_fold(_design(n_len, base_extra), y, seed, g)
        auc_base = float(metrics_matrix(pred_base, y, fpr_levels=(), fractions=())["auc"][0])
        # same labels, groups and seed below: the same resamples for both models (paired)
        b_base = bootstrap(pred_base, y, resamples, seed, g, fpr_levels=(), fractions=())["auc"]
        if cache is not None:
            cache[key] = pred_base, auc_base, b_base
    pred_full = _out_of_fold(_design(n_len, [*base_extra, s]), y, seed, g)
    auc_full = float(metrics_matrix(pred_full, y, fpr_levels=(), fractions=())["auc"][0])
    b_full = bootstrap(pred_full, y, resamples, seed, g, fpr_levels=(), fractions=())["auc"]
    lo, hi = interval(b_full - b_base, level, effective_records(y, g))
    p = lr_p(s, y, n_len, base_extra, g)
    return Gain(auc_full - auc_base, lo, hi, auc_base, auc_full, p, n, base)
