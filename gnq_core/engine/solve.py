"""Batch kernel K -> GNQ, exactly, in float64 (DESIGN.md §1).

GNQ_j = g_jᵀ (Σ_{k≠j} g_k g_kᵀ + λI)⁻¹ g_j = h_j / (1 − h_j) with h = diag(K M),
M = (K + λI)⁻¹ = L⁻ᵀL⁻¹, L = cholesky(K + λI).  Since K M = I − λM, 1 − h_j = λ M_jj =
λ‖L⁻¹ e_j‖², a sum of squares: large GNQ never needs clamping (the usual h.clamp(max=1−1e-6)
caps it at 10⁶).  h_j itself is taken from diag(K M), not 1 − λ M_jj, so small GNQ keeps
its digits too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class GNQNumericalError(ArithmeticError):
    """K + λI could not be factorised (non-finite entries or not positive definite)."""


@dataclass(frozen=True)
class Solution:
    gnq: torch.Tensor  # float64 [B]
    condition: float  # 2-norm condition number of K + λI


def gnq_from_kernel(kernel: torch.Tensor, lam: float) -> Solution:
    """GNQ of every example of a batch from its B×B gradient kernel K = G Gᵀ."""
    if lam <= 0:
        raise ValueError(f"lam must be > 0, got {lam}")
    if kernel.ndim != 2 or kernel.shape[0] != kernel.shape[1]:
        raise ValueError(f"kernel must be square, got shape {tuple(kernel.shape)}")
    K = kernel.to(torch.float64)
    if not torch.isfinite(K).all():
        raise GNQNumericalError("the gradient kernel has NaN/Inf entries (non-finite loss or gradient)")
    K = 0.5 * (K + K.T)  # symmetric up to rounding already; make it exactly so for Cholesky
    eye = torch.eye(K.shape[0], dtype=torch.float64, device=K.device)
    A = K + lam * eye
    L, info = torch.linalg.cholesky_ex(A)
    eig = torch.linalg.eigvalsh(A)
    if int(info) != 0:
        raise GNQNumericalError(
            f"K + λI is not positive definite (λ={lam:g}, smallest eigenvalue {eig[0].item():.3e}); "
            "λ is too small for the scale of the gradients"
        )
    L_inv = torch.linalg.solve_triangular(L, eye, upper=False)
    m_diag = (L_inv * L_inv).sum(dim=0)  # M_jj = ‖L⁻¹ e_j‖² = (1 − h_j)/λ, a sum of squares
    # h_j = [K M]_jj directly, not as 1 − λM_jj: that difference cancels when GNQ ≪ 1
    # (well-explained examples, large λ), while this sum keeps full relative precision.
    h = (K * (L_inv.T @ L_inv)).sum(dim=1)
    gnq = h / (lam * m_diag)
    condition = (eig[-1] / eig[0]).item()
    return Solution(gnq=gnq, condition=condition)


def unweight_kernel(kernel: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """K_true = W⁻¹ K W⁻¹ for a training objective Σ_j w_j ℓ_j (DESIGN.md §1)."""
    w = weights.detach().to(device=kernel.device, dtype=torch.float64).reshape(-1)
    if w.shape[0] != kernel.shape[0]:
        raise ValueError(f"weights has {w.shape[0]} entries but the batch has {kernel.shape[0]}")
    if not torch.isfinite(w).all() or (w == 0).any():
        raise ValueError("weights must be finite and non-zero (w_j scales example j's gradient)")
    inv = 1.0 / w
    return kernel * inv[:, None] * inv[None, :]
