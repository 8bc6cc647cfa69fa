"""Analyses behind the dashboard's figures and tables: plain pandas/numpy, no plotting.

Every function takes the frames the store returns (``Store.example_totals`` and
``Store.trajectories``) or slices of them, never mutates its input, and answers an empty
frame (with its usual columns) or NaN when there is nothing to compute on.

Paper references (gradient-uniqueness.tex):
  * ``quantile_bins``          — Fig. 6, extraction success per GNQ_total quantile bin (§6.4);
  * ``targeted_attack_table``  — Table 3, targeted extraction by top-k budget (§6.3);
  * ``targeted_rows``          — Table 3 in the paper's own row layout, any ranking columns;
  * ``group_auc`` / ``group_separation`` — Fig. 3, surprising vs. common-knowledge texts (§6.2);
  * ``top_bottom``             — Table 4, highest and lowest GNQ texts (§6.4).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from gnq_core.analysis.clusters import numeric_column
from gnq_core.analysis.predictive import rank_auc

QUANTILE_BIN_COLUMNS = ["bin", "n", "lo", "hi", "mean_score", "success_rate", "mean_match", "example_ids"]
TARGETED_COLUMNS = ["fraction", "k", "n", "base_rate", "by_gnq", "by_loss", "by_self_influence",
                    "random_mean", "random_std", "by_gnq_count", "by_loss_count",
                    "by_self_influence_count", "by_gnq_groups"]
SEPARATION_COLUMNS = ["point", "label", "auc", "median_positive", "median_negative",
                      "n_positive", "n_negative"]
NEAREST_COLUMNS = ["example_id", "distance"]
ALIGNMENT_COLUMNS = ["position", "original", "generated", "match"]

# Targeted-attack strategies: (output column, ranking column, rank highest first?).
_STRATEGIES = [("by_gnq", "gnq_total", True),
               ("by_loss", "loss_last", False),          # lowest loss first: the MIA-style pick
               ("by_self_influence", "self_influence_last", True)]


def _successes(match: pd.Series, threshold: float) -> pd.Series:
    return (match >= threshold).astype(float)


# --------------------------------------------------------------------------- Fig. 6
def quantile_bins(totals: pd.DataFrame, bins: int = 10, threshold: float = 1.0,
                  score: str = "gnq_total") -> pd.DataFrame:
    """Extraction success per quantile bin of ``score`` (paper Fig. 6).

    Only rows with both a score and an extraction match are used.  Bins are quantiles of the
    score's *rank* (ties broken by order of appearance), so equal scores never collapse bins;
    with fewer rows than ``bins`` every row is its own bin.  Columns: bin (1 = lowest scores),
    n, lo / hi (score range in the bin), mean_score, success_rate (share with
    extraction_match >= threshold), mean_match, example_ids (list of the bin's examples).
    """
    if totals.empty or bins < 1:
        return pd.DataFrame(columns=QUANTILE_BIN_COLUMNS)
    s, m = numeric_column(totals, score), numeric_column(totals, "extraction_match")
    keep = s.notna() & m.notna()
    if not keep.any():
        return pd.DataFrame(columns=QUANTILE_BIN_COLUMNS)
    ids = (totals["example_id"] if "example_id" in totals.columns
           else pd.Series(totals.index, index=totals.index))
    frame = pd.DataFrame({"score": s[keep], "match": m[keep], "example_id": ids[keep]})
    frame = frame.sort_values(["score", "example_id"], kind="mergesort")
    n_bins = min(int(bins), len(frame))
    # Equal-count bins over ranks 0..n-1 (what a rank-based qcut gives, without its edge cases).
    frame["bin"] = np.arange(len(frame)) * n_bins // len(frame) + 1
    frame["success"] = _successes(frame["match"], threshold)
    out = frame.groupby("bin", sort=True).agg(
        n=("score", "size"), lo=("score", "min"), hi=("score", "max"), mean_score=("score", "mean"),
        success_rate=("success", "mean"), mean_match=("match", "mean"),
        example_ids=("example_id", lambda v: [int(i) for i in v])).reset_index()
    return out.astype({"bin": int, "n": int})[QUANTILE_BIN_COLUMNS]


# --------------------------------------------------------------------------- Table 3
def _top_k(frame: pd.DataFrame, column: str, k: int, descending: bool) -> pd.DataFrame:
    """The k rows ranked first by ``column`` (NaN last, ties by example_id); empty when all NaN."""
    values = numeric_column(frame, column)
    if values.isna().all():
        return frame.iloc[0:0]
    order = pd.DataFrame({"v": -values if descending else values, "id": frame["example_id"]})
    order = order.sort_values(["v", "id"], na_position="last", kind="mergesort")
    return frame.loc[order.index[:k]]


def _attacked(totals: pd.DataFrame, threshold: float) -> tuple[pd.DataFrame, pd.Series, list[str]]:
    """The rows with an extraction match (``example_id`` from the index where the column is absent),
    their success (match >= ``threshold``) and the sorted group names ("(none)": no group)."""
    match = numeric_column(totals, "extraction_match")
    pool = totals.loc[match.notna()]
    if "example_id" not in pool.columns:
        pool = pool.assign(example_id=pool.index)
    groups = (sorted(pool["group"].fillna("(none)").astype(str).unique())
              if "group" in pool.columns and pool["group"].notna().any() else [])
    return pool, _successes(match[pool.index], threshold), groups


def _group_breakdown(rows: pd.DataFrame, success: pd.Series, groups: list[str]) -> str:
    if "group" not in rows.columns or not groups:
        return ""
    grp = rows["group"].fillna("(none)").astype(str)
    return ", ".join(f"{g}={int(success[grp.index[grp == g]].sum())}" for g in groups)


def targeted_attack_table(totals: pd.DataFrame, fractions: Sequence[float] = (0.05, 0.10, 0.20),
                          threshold: float = 1.0, seeds: int = 5, seed: int = 0) -> pd.DataFrame:
    """Share of extracted texts among the top-k picked by each strategy (paper Table 3).

    Over the rows with an extraction match, n of them: for each fraction f, k = max(1, round(f·n))
    (at most n).  by_gnq ranks by gnq_total (highest first), by_loss by loss_last (lowest
    first, the membership-inference pick), by_self_influence by self_influence_last (highest
    first); random_mean / random_std are over ``seeds`` seeded random k-subsets (population
    std).  Rates lie in [0, 1]; *_count columns hold the extracted counts; by_gnq_groups the
    per-group counts of the GNQ pick ("false=20, true=0"); base_rate the share extracted overall.
    A strategy whose column is missing or all-null gives NaN.
    """
    if totals.empty or "extraction_match" not in totals.columns:
        return pd.DataFrame(columns=TARGETED_COLUMNS)
    pool, success, groups = _attacked(totals, threshold)
    n = len(pool)
    if n == 0:
        return pd.DataFrame(columns=TARGETED_COLUMNS)
    rng = np.random.default_rng(seed)
    positions = np.arange(n)
    succ = success.to_numpy()
    rows = []
    for f in fractions:
        k = min(n, max(1, int(round(float(f) * n))))
        row: dict[str, object] = {"fraction": float(f), "k": k, "n": n, "base_rate": float(succ.mean())}
        for out, column, descending in _STRATEGIES:
            picked = _top_k(pool, column, k, descending)
            if picked.empty:
                row[out], row[f"{out}_count"] = np.nan, np.nan
                continue
            count = float(success[picked.index].sum())
            row[out], row[f"{out}_count"] = count / k, int(count)
            if out == "by_gnq":
                row["by_gnq_groups"] = _group_breakdown(picked, success, groups)
        row.setdefault("by_gnq_groups", "")
        rates = [succ[rng.choice(positions, size=k, replace=False)].mean() for _ in range(max(0, seeds))]
        row["random_mean"] = float(np.mean(rates)) if rates else np.nan
        row["random_std"] = float(np.std(rates)) if rates else np.nan
        rows.append(row)
    return pd.DataFrame(rows, columns=TARGETED_COLUMNS)


TARGETED_ROW_COLUMNS = ["target", "fraction", "k", "extracted", "rate", "groups"]


def targeted_rows(totals: pd.DataFrame, strategies: Sequence[tuple[str, str, bool]],
                  fractions: Sequence[float] = (0.05, 0.10, 0.20), threshold: float = 1.0,
                  random_trials: int = 3, seed: int = 0) -> pd.DataFrame:
    """Paper Table 3 in its own layout: one row per (target set, budget).

    ``strategies`` are (label, ranking column, highest first?); each picks the top k of the rows
    with an extraction match (k = max(1, round(f·n)) as in ``targeted_attack_table``).  Then
    ``random_trials`` rows "Random (trial t)" per budget, each a seeded random k-subset.
    Columns: target, fraction, k, extracted (count), rate (extracted / k) and groups, the
    per-group breakdown of the extracted texts ("common=0, surprising=20"); a strategy whose
    column is missing or all-null is left out.
    """
    pool, success, groups = _attacked(totals, threshold)
    if pool.empty:
        return pd.DataFrame(columns=TARGETED_ROW_COLUMNS)
    n, rows = len(pool), []

    def add(label: str, f: float, picked: pd.DataFrame) -> None:
        count = int(success[picked.index].sum())
        rows.append({"target": label, "fraction": float(f), "k": len(picked), "extracted": count,
                     "rate": count / len(picked), "groups": _group_breakdown(picked, success, groups)})

    budgets = [(float(f), min(n, max(1, int(round(float(f) * n))))) for f in fractions]
    for label, column, descending in strategies:
        for f, k in budgets:
            picked = _top_k(pool, column, k, descending)
            if not picked.empty:
                add(label, f, picked)
    rng = np.random.default_rng(seed)
    for trial in range(1, random_trials + 1):
        for f, k in budgets:
            add(f"Random (trial {trial})", f, pool.iloc[rng.choice(n, size=k, replace=False)])
    return pd.DataFrame(rows, columns=TARGETED_ROW_COLUMNS)


# --------------------------------------------------------------------------- Fig. 3
def group_auc(values: Sequence[float], groups: Sequence[str], positive: str, negative: str) -> float:
    """P(a random ``positive`` item scores higher than a random ``negative`` one), ties count ½
    (``predictive.rank_auc``: NaN values ignored, NaN when either group has none)."""
    v = pd.to_numeric(pd.Series(list(values), dtype=object), errors="coerce").astype(float).to_numpy()
    g = np.asarray([str(x) if x is not None else None for x in groups], dtype=object)
    if len(v) != len(g):
        raise ValueError(f"group_auc: {len(v)} values but {len(g)} group labels")
    return rank_auc(v[g == positive], v[g == negative])


def group_separation(traj: pd.DataFrame, positive: str, negative: str, value: str = "gnq") -> pd.DataFrame:
    """Per trajectory point: the AUC of ``value`` for positive vs. negative group, and each
    group's median and size.  Columns: point, label, auc, median_positive, median_negative,
    n_positive, n_negative; ordered by point."""
    if traj.empty or value not in traj.columns or "group" not in traj.columns:
        return pd.DataFrame(columns=SEPARATION_COLUMNS)
    rows = []
    has_label = "label" in traj.columns
    for point, part in traj.groupby("point", sort=True):
        vals = numeric_column(part, value)
        grp = part["group"].astype(object).where(part["group"].notna(), None)
        pos, neg = vals[(grp == positive) & vals.notna()], vals[(grp == negative) & vals.notna()]
        rows.append({"point": point, "label": part["label"].iloc[0] if has_label else str(point),
                     "auc": group_auc(vals.tolist(), grp.tolist(), positive, negative),
                     "median_positive": float(pos.median()) if len(pos) else np.nan,
                     "median_negative": float(neg.median()) if len(neg) else np.nan,
                     "n_positive": int(len(pos)), "n_negative": int(len(neg))})
    return pd.DataFrame(rows, columns=SEPARATION_COLUMNS)


# --------------------------------------------------------------------------- trajectories
def log_trajectory_matrix(traj: pd.DataFrame, value: str = "gnq") -> pd.DataFrame:
    """example × point matrix of log10(value); non-positive or missing values are NaN."""
    if traj.empty or value not in traj.columns:
        return pd.DataFrame()
    v = numeric_column(traj, value)
    logged = np.log10(v.where(v > 0))
    frame = pd.DataFrame({"example_id": traj["example_id"].to_numpy(), "point": traj["point"].to_numpy(),
                          "v": logged.to_numpy()})
    return frame.pivot_table(index="example_id", columns="point", values="v", aggfunc="mean", dropna=False)


def nearest_by_trajectory(traj: pd.DataFrame, example_id: int, k: int = 5) -> pd.DataFrame:
    """The k examples whose log10(GNQ) trajectories are closest (Euclidean) to ``example_id``'s.

    Trajectories are compared over the points both have a finite value at; the distance is
    rescaled to the full number of points (√(P / shared) · ‖Δ‖) so partial overlaps stay
    comparable, and examples sharing no point are left out.  Columns: example_id, distance
    (ascending, ties by example_id); the example itself is excluded.
    """
    matrix = log_trajectory_matrix(traj)
    if matrix.empty or example_id not in matrix.index or k <= 0:
        return pd.DataFrame(columns=NEAREST_COLUMNS)
    values = matrix.to_numpy(dtype=float)
    target = matrix.loc[example_id].to_numpy(dtype=float)
    diff = values - target[None, :]
    shared = np.isfinite(diff)
    n_shared = shared.sum(axis=1)
    sq = np.where(shared, diff, 0.0) ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        dist = np.sqrt(sq.sum(axis=1) * values.shape[1] / n_shared)
    out = pd.DataFrame({"example_id": matrix.index.to_numpy(), "distance": dist})
    out = out[(n_shared > 0) & (out["example_id"] != example_id)]
    out = out.sort_values(["distance", "example_id"], kind="mergesort").head(k)
    out["example_id"] = out["example_id"].astype(int)
    return out.reset_index(drop=True)[NEAREST_COLUMNS]


# --------------------------------------------------------------------------- extraction detail
def token_alignment(target_tokens: Sequence[str], generated_tokens: Sequence[str]) -> pd.DataFrame:
    """Position-by-position comparison of the true continuation and the generated one.

    The shorter sequence is padded with "" (a padded position never matches a real token).
    Columns: position (0-based), original, generated, match.
    """
    target, generated = [str(t) for t in target_tokens], [str(t) for t in generated_tokens]
    n = max(len(target), len(generated))
    target += [""] * (n - len(target))
    generated += [""] * (n - len(generated))
    return pd.DataFrame({"position": np.arange(n, dtype=int), "original": target, "generated": generated,
                         "match": np.array([a == b for a, b in zip(target, generated, strict=True)],
                                           dtype=bool)}, columns=ALIGNMENT_COLUMNS)


# --------------------------------------------------------------------------- Table 4
def top_bottom(totals: pd.DataFrame, k: int = 2,
               score: str = "gnq_total") -> tuple[pd.DataFrame, pd.DataFrame]:
    """The k rows with the highest ``score`` (highest first) and the k lowest (lowest first).

    Rows without a score are ignored; ties are broken by example_id; a row never appears in
    both (with fewer than 2k rows the bottom list gets what the top list left).
    """
    if totals.empty or score not in totals.columns or k <= 0:
        return totals.iloc[0:0], totals.iloc[0:0]
    s = numeric_column(totals, score)
    ids = totals["example_id"] if "example_id" in totals.columns else pd.Series(totals.index, totals.index)
    order = pd.DataFrame({"s": s, "id": ids})[s.notna()]
    top_idx = order.assign(neg=-order["s"]).sort_values(["neg", "id"], kind="mergesort").index[:k]
    rest = order.drop(index=top_idx)
    bottom_idx = rest.sort_values(["s", "id"], kind="mergesort").index[:k]
    return totals.loc[top_idx], totals.loc[bottom_idx]
