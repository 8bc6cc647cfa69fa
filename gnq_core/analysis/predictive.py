"""How well does each per-text signal predict the attack's outcome?  Pure functions of a frame.

For every signal column present (GNQ_total, loss, the calibrated membership scores, copies, text
length, the combined verdict's risk...) against a binary outcome (``extracted``):

* **AUC** — probability that a random extracted text scores higher (in the signal's stated
  direction) than a random kept one; ties count one half.  0.5: no information; below 0.5: the
  signal points the other way on this run.
* **TPR at 0.1% / 1% / 10% FPR** — the largest share of extracted texts caught at a threshold that
  flags at most 0.1% / 1% / 10% of the kept ones (the membership-inference literature's low-FPR view,
  Carlini et al. 2022 "LiRA").  Tied scores cannot be split, so a threshold inside a tie is not
  available: the conservative reading.
* **Precision at top 5/10/20%** — the share extracted among the k = round(q·n) highest-scoring
  texts (k ≥ 1).  Texts tied at the cut share the remaining places in expectation (as a random
  tie-break would on average), so a constant signal gets exactly the base rate.

Every number comes with an interval (analysis/clusters.py): ``resamples`` stratified
resamples of copy clusters (extracted and kept records resampled separately, so every resample
has both; a record's copies drawn together), seeded; the expanded percentile interval at
``level`` for the AUC, Wilson over the effective number of records for the rates (TPR,
precision).  Below ``MIN_RECORDS`` independent positive or negative records a row holds no
number, only "too few".  The same seed and class sizes give the same resamples for every signal, so two
signals scored on the same texts are compared *paired*.  Length is controlled next to the raw
AUC by the AUC within exact token length, pair-weighted (analysis.length_control: a short text is
easier to reproduce, so length alone can predict extraction; a signal that only tracks length
scores exactly 0.5 there).  Rates come with Wilson score intervals (``rate_interval``).

The direction of each signal is fixed before looking at the outcome (``SIGNALS``); choosing it
from the data would inflate every AUC above 0.5.  The numbers equal scikit-learn's
``roc_auc_score``/``roc_curve`` (the tests' reference); here they are NumPy, because the bootstrap
evaluates a thousand resamples at once (scikit-learn's per-call validation would make a dashboard
page wait) and importing scikit-learn costs seconds on a busy machine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gnq_core.analysis.clusters import (
    MIN_RECORDS,
    TOO_FEW,
    UNIT_RECORDS,
    UNIT_TEXTS,
    cluster_weights,
    collapse,
    effective_records,
    expanded_level,
    groups_of,
    kish,
    records,
    too_few,
    wilson,
)
from gnq_core.catalog import SIGNALS as CATALOG_SIGNALS
from gnq_core.catalog import Signal

OUTCOME = "extracted"
FPR_LEVELS = (0.001, 0.01, 0.10)
TOP_FRACTIONS = (0.05, 0.10, 0.20)
RESAMPLES = 1000
LEVEL = 0.95
ALL = "all texts"
_CELLS = 2_000_000  # resample × text cells evaluated at once (~10 float arrays of that size)


# The signals and their directions are the catalog's (gnq_core/catalog/signals.py): directions follow
# what each score is meant to measure (the project's and the literature's convention), never the data.
SIGNALS: tuple[Signal, ...] = tuple(s for s in CATALOG_SIGNALS if s.predictive)
SIGNAL_BY_COLUMN = {s.column: s for s in SIGNALS}


@dataclass
class Predictive:
    """The table (one row per signal, scope "all texts") and what produced it."""

    table: pd.DataFrame
    resamples: int
    seed: int
    level: float
    outcome: str
    stratified: pd.DataFrame = field(default_factory=pd.DataFrame)  # per signal (``stratified_table``)
    unit: str = UNIT_TEXTS        # what a row counts: texts (copies resampled together) or records
    min_records: int = MIN_RECORDS
    boot_auc: dict[tuple[str, str], np.ndarray] = field(repr=False, default_factory=dict)
    rows_of: dict[tuple[str, str], tuple[int, ...]] = field(repr=False, default_factory=dict)

    def method(self) -> str:
        """How the numbers were made, in one paragraph (for captions and reports)."""
        return (f"Outcome: `{self.outcome}` of the run's latest attack (texts not attackable are left out). "
                f"AUC: P(an extracted text scores higher than a kept one, ties ½) in the stated direction. "
                f"TPR at x% FPR: largest share of extracted texts caught while flagging at most x% of the "
                f"kept ones (n/a with fewer than 1/x kept records, which cannot resolve that rate). "
                f"Precision at top q: share extracted among the round(q·n) highest-scoring texts "
                f"(ties at the cut shared in expectation). Unit: {self.unit}"
                + (" (copies collapsed to one record)" if self.unit == UNIT_RECORDS else
                   " (copies of one record resampled together)")
                + f". {interval_method(self.resamples, self.seed, self.level, self.min_records)} "
                + LENGTH_METHOD)


def interval_method(resamples: int, seed: int, level: float, min_records: int = MIN_RECORDS) -> str:
    """How every interval of analysis/ is made, in words."""
    return (f"Intervals: {level:.0%} expanded percentile intervals (widened for few records: "
            f"sqrt(k/(k-1))·t with k the effective number of records) over {resamples} bootstrap resamples "
            f"of copy clusters, stratified by outcome (seed {seed}); rates (TPR, precision): Wilson score "
            f"intervals over the effective number of records; a record with copies is one independent "
            f"observation. With fewer than {min_records} independent positive or negative records a "
            f"number is shown as \"{TOO_FEW}\", not as a result.")


LENGTH_METHOD = ("Length control: the AUC within exact token length, pair-weighted (only an extracted and a "
                 "kept text of the same length are compared; a length whose texts share one outcome adds "
                 "nothing), so a signal that only tracks length scores 0.5.")


def signals_in(frame: pd.DataFrame) -> list[Signal]:
    """The signals with at least one value in ``frame`` (missing ones are simply absent)."""
    return [s for s in SIGNALS if s.column in frame.columns
            and pd.to_numeric(frame[s.column], errors="coerce").notna().any()]


def oriented(values: pd.Series | np.ndarray, signal: Signal) -> np.ndarray:
    """Scores where higher = more likely extracted (a reversed signal is negated)."""
    v = pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(dtype=float)
    return v if signal.higher_means_extracted else -v


# ----------------------------------------------------------------------------------------- metrics
def metrics_matrix(scores: np.ndarray, labels: np.ndarray, weights: np.ndarray | None = None,
                   fpr_levels: Sequence[float] = FPR_LEVELS,
                   fractions: Sequence[float] = TOP_FRACTIONS) -> dict[str, np.ndarray]:
    """AUC, TPR at each FPR level and precision at each top fraction of one sample (``scores``,
    ``labels``: one entry per text), once per row of ``weights`` (rows × texts: how many times
    each text is in that resample; None: the sample itself, one row).  Keys: ``auc``,
    ``tpr@{α}``, ``precision@{q}``; values have one entry per row.

    A resample is a weighting of the sample, so the texts are sorted once for every resample:
    texts with equal scores form one tie group, which shares one ROC point (the group's end)
    whatever its weights; a text with weight 0 adds nothing."""
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels, dtype=bool)
    n = len(s)
    w = np.ones((1, n)) if weights is None else np.asarray(weights, dtype=float)
    order = np.argsort(-s, kind="stable")
    s, y, w = s[order], y[order], w[:, order]
    last = _group_ends(s)
    end = np.minimum.accumulate(np.where(last, np.arange(n), n - 1)[::-1])[::-1]  # tie group's end
    first = np.ones(n, dtype=bool)
    first[1:] = last[:-1]
    start = np.maximum.accumulate(np.where(first, np.arange(n), 0))              # and start
    tp, fp = np.cumsum(w * y, axis=1), np.cumsum(w * ~y, axis=1)
    n1, n0 = tp[:, -1], fp[:, -1]
    tp_end, fp_end = tp[:, end], fp[:, end]
    # ROC area by trapezoids over the points (0,0), (fp_end_i, tp_end_i), ...: repeated points add 0.
    tp_prev = np.concatenate([np.zeros((len(w), 1)), tp_end[:, :-1]], axis=1)
    fp_prev = np.concatenate([np.zeros((len(w), 1)), fp_end[:, :-1]], axis=1)
    out = {"auc": ((fp_end - fp_prev) * (tp_end + tp_prev) / 2).sum(axis=1) / (n1 * n0)}
    for alpha in fpr_levels:
        allowed = fp_end <= alpha * n0[:, None] + 1e-9
        out[f"tpr@{alpha:g}"] = np.where(allowed, tp_end, 0).max(axis=1) / n1
    total = tp + fp
    rows = np.arange(len(w))
    for q in fractions:
        k = top_k(n, q)
        cut = np.argmax(total >= k - 1e-9, axis=1)  # the first text that fills the k-th place
        g0, g1 = start[cut], end[cut]               # its tie group
        before = g0 > 0
        above = np.where(before, total[rows, np.maximum(g0 - 1, 0)], 0.0)
        pos_above = np.where(before, tp[rows, np.maximum(g0 - 1, 0)], 0.0)
        tied, pos_tied = total[rows, g1] - above, tp[rows, g1] - pos_above
        out[f"precision@{q:g}"] = (pos_above + (k - above) * pos_tied / tied) / k
    return out


def _group_ends(sorted_scores: np.ndarray) -> np.ndarray:
    """True where a tie group of the (descending) sorted scores ends: the only places a threshold fits."""
    last = np.ones(len(sorted_scores), dtype=bool)
    last[:-1] = sorted_scores[1:] != sorted_scores[:-1]
    return last


def rank_auc(positive: Sequence[float] | np.ndarray, negative: Sequence[float] | np.ndarray) -> float:
    """The AUC of two samples in its Mann–Whitney form, U / (n₊·n₋): P(a positive value exceeds a
    negative one), ties ½; NaN values are ignored, NaN when either side has none."""
    pos, neg = (np.asarray(v, dtype=float) for v in (positive, negative))
    pos, neg = pos[~np.isnan(pos)], neg[~np.isnan(neg)]
    if len(pos) == 0 or len(neg) == 0:
        return math.nan
    ranks = pd.Series(np.concatenate([pos, neg])).rank(method="average").to_numpy()
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def roc_curve_points(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(FPR, TPR) at every threshold, from (0, 0) to (1, 1): scikit-learn's ``roc_curve`` with
    ``drop_intermediate=False`` (tested), without importing scikit-learn (seconds on a busy machine)."""
    s, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    last = _group_ends(s)
    tp, fp = np.cumsum(y)[last], np.cumsum(~y)[last]
    return (np.concatenate([[0.0], fp / max(1, fp[-1])]), np.concatenate([[0.0], tp / max(1, tp[-1])]))


def top_k(n: int, fraction: float) -> int:
    """Texts in the top ``fraction`` of ``n``: round(q·n), at least 1."""
    return max(1, min(n, int(math.floor(fraction * n + 0.5))))


def bootstrap(scores: np.ndarray, labels: np.ndarray, resamples: int = RESAMPLES, seed: int = 0,
              groups: np.ndarray | None = None, **kwargs) -> dict[str, np.ndarray]:
    """``metrics_matrix`` over stratified resamples of one sample (in memory-bounded chunks): each
    resample draws the extracted texts from the extracted ones and the kept from the kept, so it
    keeps both class sizes (``clusters.cluster_weights``); ``groups``: copy clusters, drawn whole."""
    weights = cluster_weights(labels, groups, resamples, seed)
    chunk = max(1, _CELLS // max(1, len(weights[0])))
    parts = [metrics_matrix(scores, labels, weights[i:i + chunk], **kwargs)
             for i in range(0, resamples, chunk)]
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


def interval(samples: np.ndarray, level: float = LEVEL, records: float = math.inf) -> tuple[float, float]:
    """The percentile interval of bootstrap ``samples``; with ``records`` (the effective number of
    independent records on the rarer side, ``clusters.effective_records``) the expanded percentile
    interval, wider for few records (``clusters.expanded_level``)."""
    tail = (1 - expanded_level(level, records)) / 2 * 100
    lo, hi = np.percentile(samples, [tail, 100 - tail])
    return float(lo), float(hi)


def metric_interval(key: str, value: float, boot: np.ndarray, scores: np.ndarray, labels: np.ndarray,
                    groups: np.ndarray | None, level: float = LEVEL) -> tuple[float, float]:
    """The interval of one metric of ``metrics_matrix``: for a rate (``tpr@…``: a share of the
    positives; ``precision@…``: a share of the top-ranked texts) the Wilson interval over the
    effective number of records it is a share of (``clusters.wilson``); for the AUC the expanded
    percentile interval of the cluster-bootstrap ``boot``."""
    y = np.asarray(labels, dtype=bool)
    if key.startswith("tpr@"):
        return wilson(value, kish(None if groups is None else groups[y], int(y.sum())), level)
    if key.startswith("precision@"):
        k = top_k(len(y), float(key[len("precision@"):]))
        top = np.argsort(-np.asarray(scores, dtype=float), kind="stable")[:k]
        return wilson(value, kish(None if groups is None else groups[top], k), level)
    return interval(boot, level, effective_records(y, groups))


def metrics_with_intervals(scores: np.ndarray, labels: np.ndarray, groups: np.ndarray | None,
                           resamples: int, seed: int, level: float = LEVEL,
                           **kwargs) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """``metrics_matrix`` of one sample as ``{key: value, "key lo": .., "key hi": ..}`` (each
    interval by ``metric_interval``), and the cluster-bootstrap samples behind them."""
    boot = bootstrap(scores, labels, resamples, seed, groups, **kwargs)
    row: dict[str, float] = {}
    negatives = records(labels, groups)[1]
    for key, value in metrics_matrix(scores, labels, **kwargs).items():
        if key.startswith("tpr@") and not resolves(float(key[4:]), negatives):
            row[key] = row[f"{key} lo"] = row[f"{key} hi"] = math.nan  # shown "n/a": see ``resolves``
            continue
        row[key] = float(value[0])
        row[f"{key} lo"], row[f"{key} hi"] = metric_interval(key, row[key], boot[key], scores, labels,
                                                             groups, level)
    return row, boot


def resolves(fpr: float, negatives: int) -> bool:
    """Whether ``negatives`` independent negative records can resolve a false-positive rate of
    ``fpr``: at least 1 / fpr of them (with 74, a "0.1% FPR" allows no false positive at all, the
    same cut as 1%, and says nothing of 0.1%)."""
    return negatives >= math.ceil(1.0 / fpr - 1e-9)


def rate_interval(outcomes: Sequence[bool] | np.ndarray, resamples: int | None = None,
                  seed: int | None = None, level: float = LEVEL) -> tuple[float, float, float]:
    """A rate (share of True) with its Wilson score interval: (rate, lo, hi); all NaN for no
    outcomes.  Wilson, not a bootstrap: a percentile bootstrap of 0 of n (or n of n) collapses to
    [0, 0] ([1, 1]), claiming certainty from a handful of texts.  ``resamples``, ``seed``: unused
    (the interval is closed-form), accepted so callers written for the bootstrap keep working."""
    y = np.asarray(outcomes, dtype=bool)
    if len(y) == 0:
        return float("nan"), float("nan"), float("nan")
    lo, hi = wilson_interval(int(y.sum()), len(y), level)
    return float(y.mean()), lo, hi


def wilson_interval(successes: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of ``successes`` of ``n`` (scipy's ``binomtest``)."""
    from scipy.stats import binomtest

    ci = binomtest(int(successes), int(n)).proportion_ci(confidence_level=level, method="wilson")
    return float(ci.low), float(ci.high)


# ----------------------------------------------------------------------------------------- tables
def evaluate(frame: pd.DataFrame, *, outcome: str = OUTCOME, resamples: int = RESAMPLES, seed: int = 0,
             level: float = LEVEL, signals: Sequence[Signal] | None = None,
             fpr_levels: Sequence[float] = FPR_LEVELS, unit: str = UNIT_TEXTS,
             min_records: int = MIN_RECORDS) -> Predictive:
    """The predictive-power table of every signal in ``frame`` against ``outcome`` over all texts,
    and next to it (``stratified``) the AUC within exact token length.  Rows whose outcome is
    missing (not attacked) are left out; each signal is scored on the rows where it has a value
    (``n`` says how many).  Copies (``cluster_id``) are resampled together; ``unit`` "records":
    copies collapsed to one record first (``clusters.collapse``).  With fewer than
    ``min_records`` independent positive or negative records a row holds no number, only its
    ``note`` ("too few: ...")."""
    if resamples < 10:
        raise ValueError("resamples must be at least 10 for an interval")
    attacked = frame[frame[outcome].notna()] if outcome in frame.columns else frame.iloc[0:0]
    if unit == UNIT_RECORDS:
        attacked = collapse(attacked, (outcome,))
    chosen = list(signals) if signals is not None else signals_in(attacked)
    result = Predictive(table=pd.DataFrame(), resamples=resamples, seed=seed, level=level, outcome=outcome,
                        unit=unit, min_records=min_records)
    rows = []
    y_all = attacked[outcome].astype(bool).to_numpy()
    groups_all = groups_of(attacked)
    for signal in chosen:
        score = oriented(attacked[signal.column], signal)
        keep = np.isfinite(score)
        y, s, groups = y_all[keep], score[keep], groups_all[keep]
        row: dict = {"scope": ALL, "unit": unit, "signal": signal.column, "label": signal.label,
                     "direction": "higher" if signal.higher_means_extracted else "lower",
                     "n": int(keep.sum()), "extracted": int(y.sum()), "records": records(y, groups)[0]}
        few = too_few(y, groups, min_records) if 0 < y.sum() < len(y) else ""
        if few:
            row["note"] = few
        elif 0 < y.sum() < len(y):
            values, boot = metrics_with_intervals(s, y, groups, resamples, seed, level, fpr_levels=fpr_levels)
            row |= values
            result.boot_auc[(ALL, signal.column)] = boot["auc"]
            result.rows_of[(ALL, signal.column)] = tuple(attacked.index[keep])
        rows.append(row)
    columns = _columns(fpr_levels)
    result.table = pd.DataFrame(rows, columns=columns) if rows else pd.DataFrame(columns=columns)
    result.stratified = stratified_table(attacked, chosen, outcome=outcome, resamples=resamples, seed=seed,
                                         level=level, min_records=min_records)
    return result


# ------------------------------------------------------------------------------ within length
def length_strata(lengths: np.ndarray, labels: np.ndarray, merge: bool = False) -> np.ndarray:
    """A stratum id per text: one per exact length; with ``merge``, a length whose texts share one
    outcome is merged with the following (longer) lengths until the stratum holds both outcomes,
    a one-outcome remainder at the long end joining the last stratum.  -1: no length."""
    lengths = np.asarray(lengths, dtype=float)
    y = np.asarray(labels, dtype=bool)
    strata = np.full(len(lengths), -1, dtype=int)
    known = np.isfinite(lengths)
    if not merge:
        values, codes = np.unique(lengths[known], return_inverse=True)
        strata[known] = codes
        return strata
    current, pos, neg, members, last_closed = 0, 0, 0, [], -1
    for value in np.unique(lengths[known]):
        at = np.flatnonzero(known & (lengths == value))
        members.append(at)
        pos, neg = pos + int(y[at].sum()), neg + int((~y[at]).sum())
        if pos and neg:
            strata[np.concatenate(members)] = current
            last_closed, current, pos, neg, members = current, current + 1, 0, 0, []
    if members:  # the long end's one-outcome remainder
        strata[np.concatenate(members)] = max(last_closed, 0)
    return strata


@dataclass(frozen=True)
class WithinLength:
    auc: float      # NaN: no stratum holds both outcomes
    lo: float
    hi: float
    strata: int     # strata scored (holding both outcomes)
    pairs: int      # positive × negative pairs compared
    merged: int     # lengths merged into a neighbour because they had one outcome (``merge=True``)
    note: str = ""  # "too few: ..." when the records are too few for a result


def within_length_auc(scores: np.ndarray, labels: np.ndarray, lengths: np.ndarray, *,
                      resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL,
                      merge: bool = False, groups: np.ndarray | None = None,
                      min_records: int = 0) -> WithinLength:
    """Pair-weighted AUC within exact token length (see the module docstring), on the texts with
    a finite score and length, with a percentile bootstrap interval.  The resamples draw texts
    from all lengths at once (stratified by outcome only, ``cluster_weights``: two signals on
    the same texts get the same resamples), so a length's pairs vary between resamples as they
    would between samples; resampling each length on its own held its tiny counts fixed and
    covered 0.5 for a random signal in 60% of samples of 300 texts (nominal 95%).  ``groups``
    (copy clusters): whole clusters are resampled and the interval is expanded for the effective
    number of records (analysis.clusters); with fewer than ``min_records`` positive or negative
    records among the scored strata, no number (``note`` says why)."""
    s, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    n_len = np.asarray(lengths, dtype=float)
    keep = np.isfinite(s) & np.isfinite(n_len)
    g = None if groups is None else np.asarray(groups)[keep]
    s, y, n_len = s[keep], y[keep], n_len[keep]
    strata = length_strata(n_len, y, merge)
    merged = int(len(np.unique(n_len)) - len(np.unique(strata[strata >= 0]))) if len(n_len) else 0
    parts = [strata == k for k in np.unique(strata[strata >= 0])]
    parts = [p for p in parts if y[p].any() and (~y[p]).any()]
    if not parts:
        return WithinLength(math.nan, math.nan, math.nan, 0, 0, merged)
    pairs = np.array([y[p].sum() * (~y[p]).sum() for p in parts], dtype=float)
    scored = np.any(parts, axis=0)
    few = too_few(y[scored], None if g is None else g[scored], min_records) if min_records else ""
    if few:
        return WithinLength(math.nan, math.nan, math.nan, len(parts), int(pairs.sum()), merged, few)
    aucs = np.array([metrics_matrix(s[p], y[p], fpr_levels=(), fractions=())["auc"][0] for p in parts])
    weights = cluster_weights(y, g, resamples, seed)
    boot = []
    for rows in np.array_split(weights, max(1, resamples * len(y) // _CELLS)):
        num, den = np.zeros(len(rows)), np.zeros(len(rows))
        for p in parts:
            w = rows[:, p]
            resampled_pairs = (w @ y[p]) * (w @ ~y[p])
            with np.errstate(invalid="ignore", divide="ignore"):
                auc = metrics_matrix(s[p], y[p], w, fpr_levels=(), fractions=())["auc"]
            num += np.where(resampled_pairs > 0, auc, 0.0) * resampled_pairs
            den += resampled_pairs
        boot.append(num / np.where(den > 0, den, np.nan))
    values = np.concatenate(boot)
    k = effective_records(y[scored], None if g is None else g[scored])
    lo, hi = interval(values[np.isfinite(values)], level, k)
    return WithinLength(float(pairs @ aucs / pairs.sum()), lo, hi, len(parts), int(pairs.sum()), merged)



STRATIFIED_COLUMNS = ["signal", "label", "auc", "auc lo", "auc hi", "stratified auc", "stratified lo",
                      "stratified hi", "strata", "pairs", "records", "note"]


def stratified_table(attacked: pd.DataFrame, signals: Sequence[Signal], *, outcome: str = OUTCOME,
                     resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL,
                     min_records: int = MIN_RECORDS) -> pd.DataFrame:
    """Per signal: the raw AUC over all attacked texts next to the AUC within exact token length,
    pair-weighted (``within_length_auc``), both with cluster-bootstrap intervals
    (copies by ``cluster_id``).  Without an ``n_tokens`` column every text has one length, so
    then the two agree."""
    y = attacked[outcome].astype(bool).to_numpy() if len(attacked) else np.zeros(0, dtype=bool)
    lengths = (pd.to_numeric(attacked["n_tokens"], errors="coerce").to_numpy(dtype=float)
               if "n_tokens" in attacked.columns else np.zeros(len(attacked)))
    groups = groups_of(attacked)
    rows = []
    for signal in signals:
        score = oriented(attacked[signal.column], signal)
        keep = np.isfinite(score)
        row: dict = {"signal": signal.column, "label": signal.label,
                     "records": records(y[keep], groups[keep])[0]}
        few = too_few(y[keep], groups[keep], min_records)
        if few and 0 < y[keep].sum() < keep.sum():
            row["note"] = few
        elif 0 < y[keep].sum() < keep.sum():
            row |= metrics_with_intervals(score[keep], y[keep], groups[keep], resamples, seed, level,
                                          fpr_levels=(), fractions=())[0]
            w = within_length_auc(score, y, lengths, resamples=resamples, seed=seed, level=level,
                                  groups=groups, min_records=min_records)
            row |= {"stratified auc": w.auc, "stratified lo": w.lo, "stratified hi": w.hi,
                    "strata": w.strata, "pairs": w.pairs}
        rows.append(row)
    return pd.DataFrame(rows, columns=STRATIFIED_COLUMNS)


def _is_too_few(row: pd.Series) -> bool:
    note = row.get("note")
    return isinstance(note, str) and note.startswith(TOO_FEW)


def interval_cell(row: pd.Series, key: str, fmt: str = ".2f", lo: str = "", hi: str = "") -> str:
    """"value [lo, hi]" of ``key`` (its bounds in "``key`` lo" and "``key`` hi" unless named); "too
    few" for no value where the row's note says the records are too few, else "n/a"."""
    if pd.isna(row.get(key)):
        return TOO_FEW if _is_too_few(row) else "n/a"
    return f"{row[key]:{fmt}} [{row[lo or f'{key} lo']:{fmt}}, {row[hi or f'{key} hi']:{fmt}}]"


def fmt_int(value) -> str:
    return "n/a" if pd.isna(value) else str(int(value))


def _columns(fpr_levels: Sequence[float]) -> list[str]:
    metrics = ["auc", *(f"tpr@{a:g}" for a in fpr_levels), *(f"precision@{q:g}" for q in TOP_FRACTIONS)]
    return ["scope", "unit", "signal", "label", "direction", "n", "extracted", "records",
            *(c for m in metrics for c in (m, f"{m} lo", f"{m} hi")), "note"]


def metric_title(metric: str) -> str:
    """"AUC", "TPR @ 0.1% FPR", "precision top 5%"."""
    if metric.startswith("tpr@"):
        return f"TPR @ {float(metric[4:]):.1%} FPR".replace(".0%", "%")
    if metric.startswith("precision@"):
        return f"precision top {float(metric[10:]):.0%}"
    return "AUC"


def display_table(result: Predictive, scope: str | None = ALL, digits: int = 2) -> pd.DataFrame:
    """One row per signal (and scope when ``scope`` is None): "value [lo, hi]" strings, best AUC first."""
    table = result.table if scope is None else result.table[result.table["scope"] == scope]
    order = {s: i for i, s in enumerate(dict.fromkeys(result.table["scope"]))}
    table = (table.assign(_scope=table["scope"].map(order))
             .sort_values(["_scope", "auc"], ascending=[True, False], na_position="last"))
    out = pd.DataFrame({"signal": table["label"],
                        "direction": table["direction"].map({"higher": "higher = extracted",
                                                             "lower": "lower = extracted"}),
                        result.unit: table["n"], "extracted": table["extracted"],
                        "independent positives (records)": table["records"]})
    for metric in (c for c in result.table.columns if f"{c} lo" in result.table.columns):  # table order
        out[metric_title(metric)] = [interval_cell(r, metric, f".{digits}f") for _, r in table.iterrows()]
    if scope is None:
        out.insert(0, "scope", table["scope"])
    return out.reset_index(drop=True)


# ----------------------------------------------------------------------------------------- words
def _ci(row: pd.Series, metric: str = "auc") -> str:
    return f"{row[metric]:.2f} ({row[f'{metric} lo']:.2f}–{row[f'{metric} hi']:.2f})"


def best_signal_sentence(result: Predictive, scope: str = ALL) -> str:
    """Which signal predicts extraction best in ``scope``, with intervals; says so when the data
    cannot tell the best from the next one, and when even the best is not better than chance."""
    table = result.table[result.table["scope"] == scope]
    scored = table[table["auc"].notna()].sort_values("auc", ascending=False) if "auc" in table else table
    if scored.empty:
        n = int(table["n"].max()) if len(table) else 0
        k = int(table["extracted"].max()) if len(table) else 0
        few = table[[_is_too_few(r) for _, r in table.iterrows()]]
        if len(few):
            r = few.iloc[0]
            return (f"Too few independent records to score any signal: {k} of {n} attacked {result.unit} "
                    f"were extracted, {int(r['records'])} independent record(s) once copies count once; a "
                    f"result needs at least {result.min_records} positive and {result.min_records} negative "
                    "records.")
        return (f"No signal can be scored here: {k} of {n} attacked texts were extracted, and an AUC needs "
                "both extracted and kept texts.")
    best = scored.iloc[0]
    pct = f"{result.level:.0%}"
    words = [f"{best['label']} predicts extraction best (AUC {_ci(best)}, {pct} cluster-bootstrap interval; "
             f"{int(best['extracted'])} of {int(best['n'])} {result.unit} extracted, "
             f"{int(best['records'])} independent records)"]
    if len(scored) > 1:
        second = scored.iloc[1]
        words[0] += f"; next is {second['label']} ({_ci(second)})"
        diff = _paired_difference(result, scope, best["signal"], second["signal"])
        if diff is not None:
            lo, hi = diff
            words.append(f"the paired difference in AUC is {best['auc'] - second['auc']:.2f} "
                         f"({lo:.2f}–{hi:.2f}), so "
                         + ("these data do not tell the two apart" if lo <= 0 else "the lead is clear"))
        elif best["auc lo"] <= second["auc hi"]:
            words.append("their intervals overlap, so these data do not tell the two apart")
    words = [". ".join(w[:1].upper() + w[1:] for w in words) + "."]
    if best["auc lo"] <= 0.5:
        words.append("Even the best signal's interval includes 0.5 (chance).")
    gnq = scored[scored["signal"] == "gnq_total"]
    if len(gnq) and gnq.index[0] != best.name:
        words.append(f"GNQ_total: AUC {_ci(gnq.iloc[0])}.")
    reversed_ = scored[scored["auc hi"] < 0.5]
    if len(reversed_):
        words.append("Pointing the other way than assumed (interval below 0.5; the low end marks the "
                     "extracted texts, with AUC 1 − x when read reversed): "
                     + ", ".join(f"{r['label']} ({_ci(r)}, reversed {1 - r['auc']:.2f})"
                                 for _, r in reversed_.iterrows()) + ".")
    return " ".join(words)


def within_length_sentence(result: Predictive, columns: Sequence[str] | None = None) -> str:
    """Each named signal's AUC within exact token length with its interval; by default GNQ_total,
    the two best signals over all texts and text length itself (0.5 by construction)."""
    table = result.stratified
    scored = table[table["stratified auc"].notna()] if len(table) else table
    if scored.empty and len(table) and any(_is_too_few(r) for _, r in table.iterrows()):
        return f"Within exact token length: {TOO_FEW} independent records to score."
    if scored.empty:
        return ("Within exact token length no signal can be scored (no length holds both an extracted "
                "and a kept text, even after merging neighbouring lengths).")
    if columns is None:
        best = scored.sort_values("auc", ascending=False)["signal"][:2]
        columns = list(dict.fromkeys(["gnq_total", *best]))
    rows = scored.set_index("signal")
    parts = [f"{rows.loc[c, 'label']} {rows.loc[c, 'stratified auc']:.2f} "
             f"({rows.loc[c, 'stratified lo']:.2f}–{rows.loc[c, 'stratified hi']:.2f}; all texts "
             f"{rows.loc[c, 'auc']:.2f})" for c in columns if c in rows.index]
    first = rows.iloc[0]
    return (f"Within exact token length ({int(first['strata'])} lengths, {int(first['pairs']):,} "
            f"extracted×kept pairs of equal length), AUC: " + "; ".join(parts) + ".")


def _paired_difference(result: Predictive, scope: str, a: str, b: str) -> tuple[float, float] | None:
    """Interval of AUC(a) − AUC(b) over the shared resamples, when both were scored on the same texts."""
    if result.rows_of.get((scope, a)) != result.rows_of.get((scope, b)):
        return None
    return interval(result.boot_auc[(scope, a)] - result.boot_auc[(scope, b)], result.level)


def roc_points(frame: pd.DataFrame, signals: Sequence[Signal] | None = None,
               outcome: str = OUTCOME) -> pd.DataFrame:
    """Long frame (signal, label, fpr, tpr) of each signal's ROC curve over the attacked texts, in
    the signal's stated direction."""
    attacked = frame[frame[outcome].notna()] if outcome in frame.columns else frame.iloc[0:0]
    parts = []
    for signal in signals if signals is not None else signals_in(attacked):
        s = oriented(attacked[signal.column], signal)
        keep = np.isfinite(s)
        y = attacked[outcome].astype(bool).to_numpy()[keep]
        if 0 < y.sum() < len(y):
            fpr, tpr = roc_curve_points(s[keep], y)
            parts.append(pd.DataFrame({"signal": signal.column, "label": signal.label, "fpr": fpr,
                                       "tpr": tpr}))
    columns = ["signal", "label", "fpr", "tpr"]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)
