"""What GNQ is on this run (docs/DESIGN.md §8): how far it departs from the gradient norm, and
the record-level GNQ of each copy cluster.  Pure functions of the stored per-text scores.

With no batch companions GNQ_j = K_jj / λ (K_jj = ‖g_j‖², the gradient norm squared); the
companions can only lower it.  r_j = GNQ_j · λ_eff / K_jj ∈ (0, 1] is the share of the gradient
its companions leave unexplained (in the ridge-weighted sense of the solve), 1 − r_j the share
they explain.  When r is close to 1 for every text, GNQ ranks texts like the gradient norm.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# Thresholds of the sentence (justified in docs/DESIGN.md §8).
LIKE_NORM_EXPLAINED = 0.05   # median share explained by companions below this ...
LIKE_NORM_SPEARMAN = 0.95    # ... and Spearman with K_jj at least this: "ranks like the gradient norm"
MOSTLY_EXPLAINED = 0.25      # below this: "mostly like the gradient norm"


def lam_eff(scores: pd.DataFrame, lam: float, lam_mode: str) -> pd.Series:
    """λ_eff per score row: ``lam`` (absolute) or ``lam`` × the batch's mean K_jj (relative,
    engine/solve.effective_lam; a batch whose K_jj are all 0 gets ``lam``)."""
    if lam_mode != "relative":
        return pd.Series(float(lam), index=scores.index)
    mean = scores.groupby(["point", "batch_index"])["self_influence"].transform("mean")
    return (float(lam) * mean).where(mean > 0, float(lam))


def unexplained_share(scores: pd.DataFrame, lam: float, lam_mode: str = "absolute") -> pd.Series:
    """r = GNQ · λ_eff / K_jj per score row (NaN where GNQ or K_jj is missing or K_jj is 0)."""
    k = pd.to_numeric(scores["self_influence"], errors="coerce")
    gnq = pd.to_numeric(scores["gnq"], errors="coerce")
    return (gnq * lam_eff(scores, lam, lam_mode) / k.where(k > 0)).astype(float)


def summary(scores: pd.DataFrame, lam: float, lam_mode: str = "absolute") -> dict:
    """The distribution of r over the run's score rows and per point, the rank correlation of
    GNQ with the gradient norm per point, and the one sentence (``sentence``)."""
    r = unexplained_share(scores, lam, lam_mode)
    frame = scores.assign(r=r).dropna(subset=["r"])
    if frame.empty:
        return {"n": 0, "sentence": "No GNQ with its gradient norm is stored for this run."}
    q = frame["r"].quantile([0.1, 0.5, 0.9])
    per_point = []
    for point, part in frame.groupby("point", sort=True):
        rho = part["gnq"].rank().corr(part["self_influence"].rank()) if len(part) > 2 else np.nan
        per_point.append({"point": int(point), "n": len(part),
                          "median_unexplained": float(part["r"].median()),
                          "spearman_gnq_gradient_norm": float(rho)})
    rhos = pd.Series([p["spearman_gnq_gradient_norm"] for p in per_point]).dropna()
    out = {"n": int(len(frame)), "lam": float(lam), "lam_mode": lam_mode,
           "unexplained_q10": float(q.loc[0.1]), "unexplained_median": float(q.loc[0.5]),
           "unexplained_q90": float(q.loc[0.9]),
           "explained_median": float(1 - q.loc[0.5]),
           "spearman_median": float(rhos.median()) if len(rhos) else float("nan"),
           "per_point": per_point,
           "thresholds": {"like_norm_explained": LIKE_NORM_EXPLAINED,
                          "like_norm_spearman": LIKE_NORM_SPEARMAN,
                          "mostly_explained": MOSTLY_EXPLAINED}}
    out["sentence"] = sentence(out)
    return out


def sentence(s: dict) -> str:
    """One sentence a user can act on, chosen by the thresholds above."""
    explained, rho = s["explained_median"], s["spearman_median"]
    rho_text = "n/a" if np.isnan(rho) else f"{rho:.2f}"
    numbers = (f"median share explained 1 − GNQ·λ/K_jj = {explained:.1%} (10–90%: "
               f"{1 - s['unexplained_q90']:.1%}–{1 - s['unexplained_q10']:.1%}); "
               f"Spearman(GNQ, gradient norm) {rho_text} (median over points)")
    if explained < LIKE_NORM_EXPLAINED and not np.isnan(rho) and rho >= LIKE_NORM_SPEARMAN:
        return (f"Batch companions explain under {LIKE_NORM_EXPLAINED:.0%} of a typical gradient: GNQ ranks "
                f"like the gradient norm on this run ({numbers}).")
    if explained < MOSTLY_EXPLAINED:
        return (f"Batch companions explain under {MOSTLY_EXPLAINED:.0%} of a typical gradient: GNQ ranks "
                f"mostly like the gradient norm, with some departures ({numbers}).")
    return (f"Batch companions explain {explained:.0%} of a typical gradient: GNQ measures something the "
            f"gradient norm does not on this run ({numbers}).")


def record_gnq(scores: pd.DataFrame, clusters: pd.DataFrame) -> pd.DataFrame:
    """Record-level GNQ per copy cluster with more than one member (DESIGN.md §8): the sum, over
    the batches (steps or audit points) where exactly one copy of the cluster appears, of that
    copy's GNQ.  Batches where copies share the batch (``shared_batches``) would need the
    leave-cluster-out solve, which needs the gradients (not stored): they are left out, so the
    value is then a lower bound (``complete`` False).

    ``clusters``: example_id, cluster_id (the copy cluster; NaN: unique)."""
    columns = ["cluster_id", "copies", "record_gnq", "batches", "shared_batches", "complete",
               "max_copy_gnq_total"]
    merged = scores.merge(clusters[["example_id", "cluster_id"]], on="example_id", how="inner")
    sizes = clusters.dropna(subset=["cluster_id"]).groupby("cluster_id").size()
    merged = merged[merged["cluster_id"].isin(sizes[sizes > 1].index)]
    if merged.empty:
        return pd.DataFrame(columns=columns)
    per_batch = merged.groupby(["cluster_id", "point", "batch_index"]).agg(
        members=("example_id", "size"), gnq=("gnq", "sum"))
    alone = per_batch[per_batch["members"] == 1]
    out = pd.DataFrame({
        "copies": sizes[sizes > 1],
        "record_gnq": alone.groupby(level="cluster_id")["gnq"].sum(min_count=1),
        "batches": per_batch.groupby(level="cluster_id").size(),
        "shared_batches": (per_batch["members"] > 1).groupby(level="cluster_id").sum(),
        "max_copy_gnq_total": merged.groupby(["cluster_id", "example_id"])["gnq"].sum().groupby(
            level="cluster_id").max(),
    }).fillna({"shared_batches": 0})
    out["shared_batches"] = out["shared_batches"].astype(int)
    out["complete"] = out["shared_batches"] == 0
    return out.reset_index(names="cluster_id")[columns].sort_values("record_gnq", ascending=False,
                                                                     na_position="last").reset_index(drop=True)


def companion_sentence(run_settings: dict) -> str | None:
    """What a run's GNQ was measured against, for a companions audit (None otherwise): the
    dashboard's and report's statement of the companion set."""
    n = run_settings.get("companions")
    if n is None:
        return None
    against = "every other text of the data" if n == "all" else f"{n} other texts of the data"
    return (f"GNQ of each text against {against} (seeded companion sets, not its batch), through "
            f"sketched gradients: {run_settings.get('sketch', 'sketch not recorded')}.")
