"""How well does each per-text signal predict the attack's outcome?  Pure functions of a frame.

For every signal column present (GNQ_total, loss, the calibrated membership scores, copies, text
length, the combined verdict's risk...) against a binary outcome (``extracted``):

* **AUC** — probability that a random extracted text scores higher (in the signal's stated
  direction) than a random kept one; ties count one half.  0.5: no information; below 0.5: the
  signal points the other way on this run.
* **TPR at 1% / 10% FPR** — the largest share of extracted texts caught at a threshold that
  flags at most 1% / 10% of the kept ones (the membership-inference literature's low-FPR view,
  Carlini et al. 2022 "LiRA").  Tied scores cannot be split, so a threshold inside a tie is not
  available: the conservative reading.
* **Precision at top 5/10/20%** — the share extracted among the k = round(q·n) highest-scoring
  texts (k ≥ 1).  Texts tied at the cut share the remaining places in expectation (as a random
  tie-break would on average), so a constant signal gets exactly the base rate.

Every number comes with a bootstrap interval: ``resamples`` stratified resamples (extracted and
kept texts resampled separately, so every resample has both), seeded; the percentile interval at
``level``.  The same seed and class sizes give the same resamples for every signal, so two
signals scored on the same texts are compared *paired*.  Scopes: all attacked texts, and within
bins of text length (``length_bins`` quantile bins of ``n_tokens`` over the attacked texts: a
short text is easier to reproduce, so length alone can predict extraction, and a signal that
only tracks length should lose its power within a bin).

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

OUTCOME = "extracted"
FPR_LEVELS = (0.01, 0.10)
TOP_FRACTIONS = (0.05, 0.10, 0.20)
RESAMPLES = 1000
LEVEL = 0.95
LENGTH_BINS = 3
ALL = "all texts"
_CELLS = 2_000_000  # resample × text cells evaluated at once (~10 float arrays of that size)


@dataclass(frozen=True)
class Signal:
    column: str
    label: str
    higher_means_extracted: bool
    meaning: str


# Directions follow what each score is meant to measure (the project's and the literature's
# convention), never the data.
SIGNALS: tuple[Signal, ...] = (
    Signal("risk", "combined verdict (risk)", True,
           "the verdict's memorisation risk before any attack (GNQ/copies exposure + calibrated membership)"),
    Signal("gnq_total", "GNQ_total", True, "GNQ summed over the run's checkpoints or epochs"),
    Signal("gnq_max", "GNQ_max", True, "the largest GNQ over the run's points"),
    Signal("gnq_last", "GNQ_last", True, "GNQ at the last point"),
    Signal("gnq_inrun_total", "GNQ in-run (accumulated)", True,
           "GNQ summed over every epoch of the training run that produced these checkpoints"),
    Signal("loss_last", "loss", False, "mean next-token loss at the last point; low = fits the text well"),
    Signal("loss_ratio", "loss ratio", False, "loss / the reference model's loss; low = learned beyond it"),
    Signal("zlib_ratio", "zlib ratio", False, "model bits / zlib bits; low = predicted beyond redundancy"),
    Signal("min_k_plus", "Min-K%++", True, "Min-K% of each token's log-prob standardised by the mean and std "
           "of log-prob under the model's own next-token distribution (Zhang et al. 2024); high = member"),
    Signal("min_k_prob", "Min-K% prob", True, "mean log-prob of the 20% least likely tokens; high = member"),
    Signal("self_influence_last", "K_jj", True, "self-influence ‖g‖² at the last point (the paper's pick)"),
    Signal("counterfactual_memorization", "counterfactual memorization", True,
           "accuracy with the text in training minus without it (subset models)"),
    Signal("copies", "copies", True, "how many texts are this text or a near copy of it"),
    Signal("n_tokens", "text length (tokens)", False, "a short text has a short continuation to reproduce"),
)
SIGNAL_BY_COLUMN = {s.column: s for s in SIGNALS}


@dataclass
class Predictive:
    """The table (one row per scope × signal) and what produced it."""

    table: pd.DataFrame
    resamples: int
    seed: int
    level: float
    outcome: str
    bins: list[str]     # the length bins scored (empty: none formed)
    bins_asked: int
    stratified: pd.DataFrame = field(default_factory=pd.DataFrame)  # per signal (``stratified_table``)
    boot_auc: dict[tuple[str, str], np.ndarray] = field(repr=False, default_factory=dict)
    rows_of: dict[tuple[str, str], tuple[int, ...]] = field(repr=False, default_factory=dict)

    def method(self) -> str:
        """How the numbers were made, in one paragraph (for captions and reports)."""
        if self.bins:
            bins = (f"Length bins: quantile bins of the token count over the attacked texts, a length shared "
                    f"by at least 1/{self.bins_asked} of them a bin of its own ({', '.join(self.bins)}).")
        else:
            bins = "No length bins: the attacked texts do not fall into two or more length bins."
        return (f"Outcome: `{self.outcome}` of the run's latest attack (texts not attackable are left out). "
                f"AUC: P(an extracted text scores higher than a kept one, ties ½) in the stated direction. "
                f"TPR at x% FPR: largest share of extracted texts caught while flagging at most x% of the "
                f"kept ones. Precision at top q: share extracted among the round(q·n) highest-scoring texts "
                f"(ties at the cut shared in expectation). Intervals: {self.level:.0%} percentile intervals "
                f"over {self.resamples} stratified bootstrap resamples (seed {self.seed}). " + bins)


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


def stratified_weights(labels: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """resamples × n counts: each resample draws the extracted texts from the extracted ones and
    the kept from the kept (with replacement), so every resample keeps both class sizes."""
    y = np.asarray(labels, dtype=bool)
    n = len(y)
    rng = np.random.default_rng(seed)
    drawn = [members[rng.integers(0, len(members), (resamples, len(members)))]
             for members in (np.flatnonzero(y), np.flatnonzero(~y)) if len(members)]
    flat = (np.concatenate(drawn, axis=1) + n * np.arange(resamples)[:, None]).ravel()
    return np.bincount(flat, minlength=resamples * n).reshape(resamples, n).astype(float)


def bootstrap(scores: np.ndarray, labels: np.ndarray, resamples: int = RESAMPLES, seed: int = 0,
              **kwargs) -> dict[str, np.ndarray]:
    """``metrics_matrix`` over stratified resamples of one sample (in memory-bounded chunks)."""
    weights = stratified_weights(labels, resamples, seed)
    chunk = max(1, _CELLS // max(1, len(weights[0])))
    parts = [metrics_matrix(scores, labels, weights[i:i + chunk], **kwargs)
             for i in range(0, resamples, chunk)]
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


def interval(samples: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(samples, [tail, 100 - tail])
    return float(lo), float(hi)


def rate_interval(outcomes: Sequence[bool] | np.ndarray, resamples: int = RESAMPLES, seed: int = 0,
                  level: float = LEVEL) -> tuple[float, float, float]:
    """A rate (share of True) with its percentile bootstrap interval: (rate, lo, hi); all NaN
    for no outcomes.  The resampled rate is a binomial draw of n with the observed rate."""
    y = np.asarray(outcomes, dtype=bool)
    if len(y) == 0:
        return float("nan"), float("nan"), float("nan")
    rate = float(y.mean())
    draws = np.random.default_rng(seed).binomial(len(y), rate, resamples) / len(y)
    lo, hi = interval(draws, level)
    return rate, lo, hi


def stratified_auc(scores: np.ndarray, labels: np.ndarray, strata: np.ndarray | Sequence,
                   resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL
                   ) -> tuple[float, float, float, int]:
    """The within-stratum AUC averaged over the strata that hold both outcomes (each stratum
    counts once), with its bootstrap interval: each stratum resampled on its own (stratified by
    outcome, seeded by [seed, stratum index], so two signals on the same texts are resampled
    alike) and the mean taken per resample.  Returns (auc, lo, hi, strata scored); NaN and 0
    when no stratum holds both outcomes.  One stratum: the plain AUC."""
    s, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    keys = pd.Series(list(strata), dtype=object).to_numpy()
    keep = np.isfinite(s)
    points, boots = [], []
    for i, key in enumerate(pd.unique(keys[keep])):
        part = keep & (keys == key)
        ys, ss = y[part], s[part]
        if 0 < ys.sum() < len(ys):
            points.append(float(metrics_matrix(ss, ys)["auc"][0]))
            stratum_seed = int(np.random.SeedSequence([seed, i]).generate_state(1)[0])
            boots.append(bootstrap(ss, ys, resamples, stratum_seed, fpr_levels=(), fractions=())["auc"])
    if not points:
        return float("nan"), float("nan"), float("nan"), 0
    lo, hi = interval(np.mean(boots, axis=0), level)
    return float(np.mean(points)), lo, hi, len(points)


# ----------------------------------------------------------------------------------------- tables
def length_bins(n_tokens: pd.Series, bins: int = LENGTH_BINS) -> pd.Series:
    """Each text's length bin ("n_tokens 5–12"; NaN: no bins): quantile bins of the token count,
    except that a length shared by at least 1/bins of the texts (texts cut to the maximum length)
    is a bin of its own, so a bin never mixes that length with others by accident of the cut."""
    values = pd.to_numeric(n_tokens, errors="coerce")
    names = pd.Series(np.nan, index=n_tokens.index, dtype=object)
    if bins < 2 or values.nunique() < 2:
        return names
    counts = values.value_counts()
    heavy = sorted(counts[counts >= len(values) / bins].index)
    groups = [values[values == v] for v in heavy]
    rest = values[values.notna() & ~values.isin(heavy)]
    if rest.nunique() > 1:  # equal lengths share a rank, hence a bin
        codes = pd.qcut(rest.rank(method="min"), max(1, bins - len(heavy)), labels=False, duplicates="drop")
        groups += [rest[codes == c] for c in codes.unique()]
    elif len(rest):
        groups.append(rest)
    for group in groups:
        lo, hi = int(group.min()), int(group.max())
        names[group.index] = f"n_tokens {lo}" if lo == hi else f"n_tokens {lo}–{hi}"
    return names


def bin_order(names: pd.Series) -> list[str]:
    """The bins' names, shortest texts first."""
    return sorted(names.dropna().unique(), key=lambda n: int(n.split()[1].split("–")[0]))


def evaluate(frame: pd.DataFrame, *, outcome: str = OUTCOME, resamples: int = RESAMPLES, seed: int = 0,
             level: float = LEVEL, bins: int = LENGTH_BINS,
             signals: Sequence[Signal] | None = None) -> Predictive:
    """The predictive-power table of every signal in ``frame`` against ``outcome``, overall and
    within length bins.  Rows whose outcome is missing (not attacked) are left out; each signal
    is scored on the rows where it has a value (``n`` says how many)."""
    if resamples < 10:
        raise ValueError("resamples must be at least 10 for an interval")
    attacked = frame[frame[outcome].notna()] if outcome in frame.columns else frame.iloc[0:0]
    chosen = list(signals) if signals is not None else signals_in(attacked)
    scopes: list[tuple[str, pd.DataFrame]] = [(ALL, attacked)]
    names = length_bins(attacked["n_tokens"], bins) if "n_tokens" in attacked.columns else pd.Series(
        np.nan, index=attacked.index, dtype=object)
    order = bin_order(names)
    if len(order) > 1:  # one bin would only repeat "all texts"
        scopes += [(name, attacked[names == name]) for name in order]
    result = Predictive(table=pd.DataFrame(), resamples=resamples, seed=seed, level=level, outcome=outcome,
                        bins=order if len(order) > 1 else [], bins_asked=bins)
    rows = []
    for scope, part in scopes:
        y_all = part[outcome].astype(bool).to_numpy()
        for signal in chosen:
            score = oriented(part[signal.column], signal)
            keep = np.isfinite(score)
            y, s = y_all[keep], score[keep]
            row: dict = {"scope": scope, "signal": signal.column, "label": signal.label,
                         "direction": "higher" if signal.higher_means_extracted else "lower",
                         "n": int(keep.sum()), "extracted": int(y.sum())}
            if 0 < y.sum() < len(y):
                point = {k: float(v[0]) for k, v in metrics_matrix(s, y).items()}
                boot = bootstrap(s, y, resamples, seed)
                for key, value in point.items():
                    row[key] = value
                    row[f"{key} lo"], row[f"{key} hi"] = interval(boot[key], level)
                result.boot_auc[(scope, signal.column)] = boot["auc"]
                result.rows_of[(scope, signal.column)] = tuple(part.index[keep])
            rows.append(row)
    result.table = pd.DataFrame(rows, columns=_COLUMNS) if rows else pd.DataFrame(columns=_COLUMNS)
    result.stratified = stratified_table(attacked, chosen, names, outcome=outcome, resamples=resamples,
                                         seed=seed, level=level)
    return result


STRATIFIED_COLUMNS = ["signal", "label", "auc", "auc lo", "auc hi", "stratified auc", "stratified lo",
                      "stratified hi", "bins scored"]


def stratified_table(attacked: pd.DataFrame, signals: Sequence[Signal], bins: pd.Series, *,
                     outcome: str = OUTCOME, resamples: int = RESAMPLES, seed: int = 0,
                     level: float = LEVEL) -> pd.DataFrame:
    """Per signal: the raw AUC over all attacked texts next to the length-stratified AUC (the
    within-length-bin AUCs averaged over the bins, ``stratified_auc``), both with intervals.
    Texts without a bin (no bins formed) form one stratum, so then the two agree."""
    strata = bins.fillna("all").to_numpy()
    y = attacked[outcome].astype(bool).to_numpy() if len(attacked) else np.zeros(0, dtype=bool)
    rows = []
    for signal in signals:
        score = oriented(attacked[signal.column], signal)
        keep = np.isfinite(score)
        row: dict = {"signal": signal.column, "label": signal.label}
        if 0 < y[keep].sum() < keep.sum():
            raw = bootstrap(score[keep], y[keep], resamples, seed, fpr_levels=(), fractions=())["auc"]
            row["auc"] = float(metrics_matrix(score[keep], y[keep], fpr_levels=(), fractions=())["auc"][0])
            row["auc lo"], row["auc hi"] = interval(raw, level)
            auc, lo, hi, k = stratified_auc(score, y, strata, resamples, seed, level)
            row |= {"stratified auc": auc, "stratified lo": lo, "stratified hi": hi, "bins scored": k}
        rows.append(row)
    return pd.DataFrame(rows, columns=STRATIFIED_COLUMNS)


def display_stratified(result: Predictive, digits: int = 2) -> pd.DataFrame:
    """``Predictive.stratified`` as "value [lo, hi]" strings, best raw AUC first."""
    table = result.stratified.sort_values("auc", ascending=False, na_position="last")

    def cell(row: pd.Series, point: str, lo: str, hi: str) -> str:
        if pd.isna(row.get(point)):
            return "n/a"
        return f"{row[point]:.{digits}f} [{row[lo]:.{digits}f}, {row[hi]:.{digits}f}]"

    return pd.DataFrame({
        "signal": table["label"],
        "AUC (all texts)": [cell(r, "auc", "auc lo", "auc hi") for _, r in table.iterrows()],
        "AUC within length bins (mean)": [cell(r, "stratified auc", "stratified lo", "stratified hi")
                                          for _, r in table.iterrows()],
        "bins": [fmt_int(v) for v in table["bins scored"]],
    }).reset_index(drop=True)


def fmt_int(value) -> str:
    return "n/a" if pd.isna(value) else str(int(value))


METRICS = ["auc", *(f"tpr@{a:g}" for a in FPR_LEVELS), *(f"precision@{q:g}" for q in TOP_FRACTIONS)]
_COLUMNS = ["scope", "signal", "label", "direction", "n", "extracted",
            *(c for m in METRICS for c in (m, f"{m} lo", f"{m} hi"))]
METRIC_TITLES = {"auc": "AUC", **{f"tpr@{a:g}": f"TPR @ {a:.0%} FPR" for a in FPR_LEVELS},
                 **{f"precision@{q:g}": f"precision top {q:.0%}" for q in TOP_FRACTIONS}}


def display_table(result: Predictive, scope: str | None = ALL, digits: int = 2) -> pd.DataFrame:
    """One row per signal (and scope when ``scope`` is None): "value [lo, hi]" strings, best AUC first."""
    table = result.table if scope is None else result.table[result.table["scope"] == scope]
    return _display(result, table, digits, with_scope=scope is None)


def display_bins(result: Predictive, digits: int = 2) -> pd.DataFrame:
    """``display_table``'s rows of the length bins that can be scored (a bin whose texts all share
    one outcome is left out: ``within_bins_sentence`` names it)."""
    table = result.table
    return _display(result, table[(table["scope"] != ALL) & table["auc"].notna()], digits, with_scope=True)


def _display(result: Predictive, table: pd.DataFrame, digits: int, with_scope: bool) -> pd.DataFrame:
    order = {s: i for i, s in enumerate(dict.fromkeys(result.table["scope"]))}
    table = (table.assign(_scope=table["scope"].map(order))
             .sort_values(["_scope", "auc"], ascending=[True, False], na_position="last"))

    def cell(row: pd.Series, metric: str) -> str:
        if pd.isna(row.get(metric)):
            return "n/a"
        lo, hi = row[f"{metric} lo"], row[f"{metric} hi"]
        return f"{row[metric]:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"

    out = pd.DataFrame({"signal": table["label"],
                        "direction": table["direction"].map({"higher": "higher = extracted",
                                                             "lower": "lower = extracted"}),
                        "texts": table["n"], "extracted": table["extracted"]})
    for metric in METRICS:
        out[METRIC_TITLES[metric]] = [cell(r, metric) for _, r in table.iterrows()]
    if with_scope:
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
        return (f"No signal can be scored here: {k} of {n} attacked texts were extracted, and an AUC needs "
                "both extracted and kept texts.")
    best = scored.iloc[0]
    pct = f"{result.level:.0%}"
    words = [f"{best['label']} predicts extraction best (AUC {_ci(best)}, {pct} bootstrap interval; "
             f"{int(best['extracted'])} of {int(best['n'])} texts extracted)"]
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


def within_bins_sentence(result: Predictive, columns: Sequence[str] | None = None) -> str:
    """The AUC range of each named signal across the length bins (where scorable); by default
    GNQ_total and the two best signals over all texts."""
    if columns is None:
        overall = result.table[(result.table["scope"] == ALL) & result.table["auc"].notna()]
        best = overall.sort_values("auc", ascending=False)["signal"][:2]
        columns = list(dict.fromkeys(["gnq_total", *best]))
    all_bins = result.table[result.table["scope"] != ALL]
    bins = all_bins[all_bins["auc"].notna()]
    one_outcome = [f"{scope} ({int(rows['extracted'].max())} of {int(rows['n'].max())} extracted)"
                   for scope, rows in all_bins.groupby("scope", sort=False) if rows["auc"].isna().all()]
    left_out = (" Not scored, one outcome only: " + ", ".join(one_outcome) + ".") if one_outcome else ""
    parts = []
    for column in columns:
        rows = bins[bins["signal"] == column]
        if len(rows):
            parts.append(f"{rows['label'].iloc[0]} {rows['auc'].min():.2f}–{rows['auc'].max():.2f}")
    if not parts:
        return ("Within length bins no signal can be scored (a bin needs both extracted and kept texts)."
                + left_out)
    k = bins["scope"].nunique()
    where = "the one length bin that holds" if k == 1 else f"the {k} length bins that hold"
    return f"Within {where} both outcomes, AUC ranges: " + "; ".join(parts) + "." + left_out


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
