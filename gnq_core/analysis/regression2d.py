"""The paper's §4 / Fig. 1 example, in numpy: 2D linear regression with one outlier.

The math — GNQ as a squared Mahalanobis length, the ellipse E_{−j} = {g : gᵀ S_{−j}⁻¹ g = 1}
(GNQ_j > 1 ⇔ g_j lies outside it), the loss threshold as a strip, and why ``gnq`` goes through
the SVD of G — is in DESIGN.md §4.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

__all__ = [
    "DEFAULT_B",
    "DEFAULT_LAM",
    "DEFAULT_OUTLIER",
    "DEFAULT_TAU",
    "DEFAULT_W",
    "DEFAULT_X",
    "DEFAULT_Y",
    "ellipse",
    "gnq",
    "gradients",
    "inside_ellipse",
    "leave_one_out_matrix",
    "loss_strip_halfwidth",
    "losses",
    "parse_points",
    "rankings",
    "residuals",
]

# The seven points of tests/engine/test_regression2d.py: six scattered around y = 2x + 1 and point 7
# (index 6) far above the line with an unremarkable x in the middle of the range.
DEFAULT_X: np.ndarray = np.array([-2.0, -1.2, -0.5, 0.4, 1.1, 1.9, 0.3])
DEFAULT_Y: np.ndarray = np.array([-2.9, -1.5, 0.1, 1.7, 3.3, 4.7, 4.6])
DEFAULT_OUTLIER: int = 6


def _inlier_fit() -> tuple[float, float]:
    mask = np.arange(DEFAULT_X.size) != DEFAULT_OUTLIER
    A = np.stack([DEFAULT_X[mask], np.ones(int(mask.sum()))], axis=1)
    (w, b), *_ = np.linalg.lstsq(A, DEFAULT_Y[mask], rcond=None)
    return float(w), float(b)


# The least-squares fit of the six inliers (w ≈ 1.977, b ≈ 0.999): the model a robust fit
# would give.  The inliers' gradients are small and balanced (they sum to zero) and only the
# outlier's gradient lies outside the ellipse of the others (GNQ > 1) for every λ ≤ 1.
DEFAULT_W, DEFAULT_B = _inlier_fit()
DEFAULT_LAM: float = 1e-2
# Between the inliers' losses (≤ 0.01) and the outlier's (≈ 4.5).
DEFAULT_TAU: float = 0.5


def _xy(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(f"x and y must be 1-D of the same length, got shapes {x.shape} and {y.shape}")
    return x, y


def _grad_matrix(G: np.ndarray) -> np.ndarray:
    G = np.asarray(G, dtype=np.float64)
    if G.ndim != 2:
        raise ValueError(f"G must be a 2-D [n, P] array, got shape {G.shape}")
    return G


def _spd2(S: np.ndarray) -> np.ndarray:
    S = np.asarray(S, dtype=np.float64)
    if S.ndim != 2 or S.shape[0] != S.shape[1]:
        raise ValueError(f"S must be a square matrix, got shape {S.shape}")
    if not np.allclose(S, S.T, rtol=1e-12, atol=0.0):
        raise ValueError("S must be symmetric")
    return S


def residuals(x: np.ndarray, y: np.ndarray, w: float, b: float) -> np.ndarray:
    """r_j = y_j − (w x_j + b)."""
    x, y = _xy(x, y)
    return y - (float(w) * x + float(b))


def losses(x: np.ndarray, y: np.ndarray, w: float, b: float) -> np.ndarray:
    """ℓ_j = r_j² / 2."""
    return 0.5 * residuals(x, y, w, b) ** 2


def gradients(x: np.ndarray, y: np.ndarray, w: float, b: float) -> np.ndarray:
    """[n, 2]: g_j = (∂ℓ_j/∂w, ∂ℓ_j/∂b) = −r_j·[x_j, 1]."""
    x, _ = _xy(x, y)
    r = residuals(x, y, w, b)
    return np.stack([-r * x, -r], axis=1)


def leave_one_out_matrix(G: np.ndarray, j: int, lam: float) -> np.ndarray:
    """S_{−j} = Σ_{k≠j} g_k g_kᵀ + λI  ([P, P]; 2×2 here)."""
    G = _grad_matrix(G)
    n, P = G.shape
    if not -n <= j < n:
        raise IndexError(f"point index {j} out of range for {n} points")
    rest = np.delete(G, j % n, axis=0)
    return rest.T @ rest + float(lam) * np.eye(P)


def gnq(G: np.ndarray, lam: float) -> np.ndarray:
    """[n]: GNQ_j = g_jᵀ S_{−j}⁻¹ g_j through the batch-space form h_j / (λ M_jj).

    K = G Gᵀ = U diag(σ²) Uᵀ (full SVD of G, U is n×n), M = (K + λI)⁻¹ = U diag(1/(σ² + λ)) Uᵀ
    (σ = 0 past rank), so h_j = [K M]_jj = Σ_k U_jk² σ_k²/(σ_k² + λ) and
    λ M_jj = 1 − h_j = Σ_k U_jk² λ/(σ_k² + λ): both sums of non-negative terms, no cancellation.
    """
    G, lam = _grad_matrix(G), float(lam)
    if not (np.isfinite(lam) and lam > 0):
        raise ValueError(f"lam must be a finite positive number, got {lam}")
    n = G.shape[0]
    if n == 0:
        return np.zeros(0)
    U, s, _ = np.linalg.svd(G, full_matrices=True)
    s2 = np.zeros(n)
    s2[: s.size] = s**2
    U2 = U**2
    h = U2 @ (s2 / (s2 + lam))
    lam_m = U2 @ (lam / (s2 + lam))
    return h / lam_m


def ellipse(S: np.ndarray, n: int = 200) -> np.ndarray:
    """[n, 2] points g on {g : gᵀ S⁻¹ g = 1}, a closed curve (the last point repeats the first).

    With S = V diag(e) Vᵀ (symmetric positive definite), g = V diag(√e) [cos t, sin t] gives
    gᵀ S⁻¹ g = cos² t + sin² t = 1.  Semi-axes √e along the eigenvectors V.
    """
    S = _spd2(S)
    if S.shape != (2, 2):
        raise ValueError(f"ellipse needs a 2×2 matrix, got shape {S.shape}")
    if n < 2:
        raise ValueError(f"n must be at least 2, got {n}")
    e, V = np.linalg.eigh(S)
    if e[0] <= 0:
        raise ValueError("S must be positive definite")
    t = np.linspace(0.0, 2.0 * np.pi, n)
    circle = np.stack([np.cos(t), np.sin(t)], axis=1)
    return (circle * np.sqrt(e)) @ V.T


def loss_strip_halfwidth(tau: float) -> float:
    """√(2τ): |∂ℓ/∂b| = |r| ≤ √(2τ) ⇔ ℓ = r²/2 ≤ τ (the loss-threshold strip in gradient space)."""
    tau = float(tau)
    if not (np.isfinite(tau) and tau >= 0):
        raise ValueError(f"tau must be a finite non-negative number, got {tau}")
    return float(np.sqrt(2.0 * tau))


def inside_ellipse(g: np.ndarray, S: np.ndarray) -> bool:
    """gᵀ S⁻¹ g ≤ 1: g lies inside (or on) the ellipse of S.  With S = S_{−j}: GNQ_j ≤ 1."""
    S = _spd2(S)
    g = np.asarray(g, dtype=np.float64)
    if g.shape != (S.shape[0],):
        raise ValueError(f"g must have shape ({S.shape[0]},), got {g.shape}")
    return bool(g @ np.linalg.solve(S, g) <= 1.0)


def rankings(x: np.ndarray, y: np.ndarray, w: float, b: float, lam: float, tau: float) -> pd.DataFrame:
    """One row per point, in input order.

    Columns: index (0-based position), x, y, residual, loss, grad_w, grad_b, gnq,
    gnq_rank (1 = most unique), loss_rank (1 = highest loss), flagged_by_loss (loss > τ, i.e.
    outside the strip |g_b| ≤ √(2τ)), flagged_by_gnq (GNQ > 1, i.e. outside the ellipse of the
    others).  Ties share the best rank ("min").
    """
    x, y = _xy(x, y)
    tau = float(tau)
    r = residuals(x, y, w, b)
    loss = 0.5 * r**2
    G = gradients(x, y, w, b)
    q = gnq(G, lam)
    df = pd.DataFrame(
        {
            "index": np.arange(x.size),
            "x": x,
            "y": y,
            "residual": r,
            "loss": loss,
            "grad_w": G[:, 0],
            "grad_b": G[:, 1],
            "gnq": q,
        }
    )
    df["gnq_rank"] = df["gnq"].rank(ascending=False, method="min").astype(int)
    df["loss_rank"] = df["loss"].rank(ascending=False, method="min").astype(int)
    df["flagged_by_loss"] = df["loss"] > tau
    df["flagged_by_gnq"] = df["gnq"] > 1.0
    return df


_SEP = re.compile(r"\s*[,;]\s*|\s+")


def parse_points(text: str) -> tuple[np.ndarray, np.ndarray]:
    """Parse "x, y" per line (comma, semicolon or whitespace between the two numbers).

    Blank lines and lines starting with '#' are skipped.  Raises ValueError with a one-line
    message naming the first bad line; needs at least 2 points, finite numbers only.
    """
    xs: list[float] = []
    ys: list[float] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = _SEP.split(line)
        if len(fields) != 2:
            raise ValueError(f"line {lineno}: expected two numbers 'x, y', got {line!r}")
        try:
            xv, yv = float(fields[0]), float(fields[1])
        except ValueError:
            raise ValueError(f"line {lineno}: not a number in {line!r}") from None
        if not (np.isfinite(xv) and np.isfinite(yv)):
            raise ValueError(f"line {lineno}: values must be finite, got {line!r}")
        xs.append(xv)
        ys.append(yv)
    if len(xs) < 2:
        raise ValueError(f"need at least 2 points, got {len(xs)}")
    return np.array(xs, dtype=np.float64), np.array(ys, dtype=np.float64)
