"""Does a signal say something about an outcome that other numbers do not?  The partial rank
correlation, with an interval over records.  Pure functions of arrays.

``partial_rank_correlation``: rank every column (Spearman's view: only the order counts, so a
signal's scale and monotone transforms do not matter), regress the signal's ranks and the
outcome's ranks on the covariates' ranks (plus an intercept) by least squares, and correlate the
two residuals.  Positive: among texts alike in the covariates, a higher signal goes with a higher
outcome.  The interval is the cluster bootstrap of analysis/clusters.py (copies resampled
together, stratified by ``labels``), each resample refitting both regressions with its weights,
read as the expanded percentile interval for the effective number of records (Kish).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import rankdata

from gnq_core.analysis.clusters import cluster_weights, kish
from gnq_core.analysis.predictive import LEVEL, RESAMPLES, interval


@dataclass(frozen=True)
class Partial:
    r: float          # partial rank correlation; NaN: too few texts
    lo: float
    hi: float
    n: int            # texts with every value
    records: float    # effective number of independent records (Kish)


def _weighted_partial(x: np.ndarray, y: np.ndarray, z: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Partial correlation of x and y given the columns of z (with intercept), once per row of
    the weights ``w`` (resamples × n)."""
    design = np.hstack([np.ones((len(x), 1)), z])
    xtwx = np.einsum("rn,np,nq->rpq", w, design, design)
    xtwx += 1e-9 * np.eye(design.shape[1])  # a resample can leave a covariate constant
    out = []
    for v in (x, y):
        beta = np.linalg.solve(xtwx, np.einsum("rn,np,n->rp", w, design, v)[..., None])[..., 0]
        out.append(v[None, :] - beta @ design.T)
    rx, ry = out
    total = w.sum(axis=1)
    mx, my = (w * rx).sum(1) / total, (w * ry).sum(1) / total
    cov = (w * (rx - mx[:, None]) * (ry - my[:, None])).sum(1)
    vx = (w * (rx - mx[:, None]) ** 2).sum(1)
    vy = (w * (ry - my[:, None]) ** 2).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return cov / np.sqrt(vx * vy)


def partial_rank_correlation(signal: np.ndarray, outcome: np.ndarray, covariates: Sequence[np.ndarray], *,
                             groups: np.ndarray | None = None, labels: np.ndarray | None = None,
                             resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL) -> Partial:
    """The partial rank correlation of ``signal`` with ``outcome`` given ``covariates`` (see the
    module docstring) on the texts where all are finite, with its interval: ``groups`` (copy
    clusters) resampled whole, stratified by ``labels`` (e.g. the outcome's top decile; None:
    unstratified)."""
    cols = [np.asarray(c, float) for c in (signal, outcome, *covariates)]
    keep = np.all([np.isfinite(c) for c in cols], axis=0)
    n = int(keep.sum())
    g = None if groups is None else np.asarray(groups)[keep]
    k = kish(g, n)
    if n < len(covariates) + 4:
        return Partial(math.nan, math.nan, math.nan, n, k)
    ranks = [rankdata(c[keep]) for c in cols]
    x, y = ranks[0], ranks[1]
    z = np.column_stack(ranks[2:]) if covariates else np.zeros((n, 0))
    r = float(_weighted_partial(x, y, z, np.ones((1, n)))[0])
    lab = np.zeros(n, bool) if labels is None else np.asarray(labels, bool)[keep]
    w = cluster_weights(lab, g, resamples, seed)
    boot = _weighted_partial(x, y, z, w)
    boot = boot[np.isfinite(boot)]
    lo, hi = interval(boot, level, k) if len(boot) else (math.nan, math.nan)
    return Partial(r, lo, hi, n, k)
