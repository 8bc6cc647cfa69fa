"""Batch kernel K -> GNQ, exactly, in float64 (DESIGN.md §1).

GNQ_j = g_jᵀ (Σ_{k≠j} g_k g_kᵀ + λI)⁻¹ g_j = h_j / (1 − h_j) with h = diag(K M),
M = (K + λI)⁻¹ = L⁻ᵀL⁻¹, L = cholesky(K + λI).  Since K M = I − λM, 1 − h_j = λ M_jj =
λ‖L⁻¹ e_j‖², a sum of squares: large GNQ never needs clamping (the usual h.clamp(max=1−1e-6)
caps it at 10⁶).  h_j itself is taken from diag(K M), not 1 − λ M_jj, so small GNQ keeps
its digits too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from gnq_core.engine.math.conventions import LAM_ABSOLUTE, check_lam_mode


class GNQNumericalError(ArithmeticError):
    """K + λI could not be factorised (non-finite entries or not positive definite)."""


WEIGHTS_MESSAGE = "weights must be finite and non-zero (w_j scales example j's gradient)"


@dataclass
class Solution:
    """GNQ of a batch, with its checks still on the device until ``check()`` reads them.

    Nothing here waits for the device: the finite check, the Cholesky status and K + λI (for
    the condition number) are fetched together by one host read in ``check()``.
    """

    gnq: torch.Tensor  # float64 [B]
    system: torch.Tensor  # K + λI, float64 [B, B], on the kernel's device
    finite: torch.Tensor  # bool scalar: K had no NaN/Inf
    info: torch.Tensor  # Cholesky status (0: positive definite)
    lam: float
    _condition: float | None = field(default=None, repr=False)

    def check(self, extra: Sequence[tuple] = ()) -> float:
        """Raise if the solve failed (or an ``extra`` (ok, message[, exception type]) condition
        is False, as ValueError by default); else the 2-norm condition number of K + λI.  One
        device-to-host read."""
        if self._condition is not None and not extra:
            return self._condition
        flags = [item[0].reshape(1).to(torch.float64) for item in extra]
        status = torch.stack([self.finite.to(torch.float64), self.info.to(torch.float64)])
        host = torch.cat([*flags, status, self.system.reshape(-1)]).cpu()
        n = len(flags)
        values = host[:n + 2].tolist()
        for item, ok in zip(extra, values, strict=False):
            if not ok:
                raise (item[2] if len(item) > 2 else ValueError)(item[1])
        if not values[n]:
            raise GNQNumericalError("the gradient kernel has NaN/Inf entries (non-finite loss or gradient)")
        eig = torch.linalg.eigvalsh(host[n + 2:].view(self.system.shape)).tolist()  # host, B×B
        if values[n + 1] != 0:
            raise GNQNumericalError(
                f"K + λI is not positive definite (λ={self.lam:g}, smallest eigenvalue "
                f"{eig[0]:.3e}); λ is too small for the scale of the gradients")
        self._condition = eig[-1] / eig[0]
        return self._condition

    @property
    def condition(self) -> float:
        """2-norm condition number of K + λI (reads the checks, see ``check``)."""
        return self.check()


def gnq_from_kernel(kernel: torch.Tensor, lam: float, *, check: bool = True) -> Solution:
    """GNQ of every example of a batch from its B×B gradient kernel K = G Gᵀ.

    ``check=False``: return without waiting for the device; call ``Solution.check()`` later
    (a non-finite or indefinite K then gives NaN/garbage GNQ until checked).
    """
    if lam <= 0:
        raise ValueError(f"lam must be > 0, got {lam}")
    if kernel.ndim != 2 or kernel.shape[0] != kernel.shape[1]:
        raise ValueError(f"kernel must be square, got shape {tuple(kernel.shape)}")
    K = kernel.to(torch.float64)
    finite = torch.isfinite(K).all()
    K = 0.5 * (K + K.T)  # symmetric up to rounding already; make it exactly so for Cholesky
    eye = torch.eye(K.shape[0], dtype=torch.float64, device=K.device)
    A = K + lam * eye
    L, info = torch.linalg.cholesky_ex(A)
    L_inv = torch.linalg.solve_triangular(L, eye, upper=False)
    m_diag = (L_inv * L_inv).sum(dim=0)  # M_jj = ‖L⁻¹ e_j‖² = (1 − h_j)/λ, a sum of squares
    # h_j = [K M]_jj directly, not as 1 − λM_jj: that difference cancels when GNQ ≪ 1
    # (well-explained examples, large λ), while this sum keeps full relative precision.
    h = (K * (L_inv.T @ L_inv)).sum(dim=1)
    gnq = h / (lam * m_diag)
    solution = Solution(gnq=gnq, system=A, finite=finite, info=info, lam=float(lam))
    if check:
        solution.check()
    return solution


def effective_lam(kernel: torch.Tensor, lam: float, mode: str = LAM_ABSOLUTE) -> float:
    """The ridge the solve uses: ``lam`` itself (``absolute``, in the units of ‖g‖²), or
    ``relative``: λ_eff = lam · mean_j K_jj, so that GNQ does not change when every gradient of
    the batch is scaled by one factor (a scale-free λ; ``lam`` is then the dimensionless c).
    A batch whose gradients are all zero (mean K_jj = 0) has GNQ 0 for any λ; it gets λ_eff = c.
    Relative mode reads the mean from the device (one host read)."""
    if check_lam_mode(mode) == LAM_ABSOLUTE:
        return float(lam)
    mean = float(kernel.diagonal().to(torch.float64).mean())
    return float(lam) * mean if mean > 0 else float(lam)


def weights_valid(weights: torch.Tensor) -> torch.Tensor:
    """Bool scalar on the weights' device: all finite and non-zero."""
    return torch.isfinite(weights).all() & (weights != 0).all()


def unweight_kernel(kernel: torch.Tensor, weights: torch.Tensor, *, validate: bool = True) -> torch.Tensor:
    """K_true = W⁻¹ K W⁻¹ for a training objective Σ_j w_j ℓ_j (DESIGN.md §1).

    ``validate=False``: leave the finite/non-zero check of the weights to the caller
    (``weights_valid``), so nothing waits for the device here.
    """
    w = weights.detach().to(device=kernel.device, dtype=torch.float64).reshape(-1)
    if w.shape[0] != kernel.shape[0]:
        raise ValueError(f"weights has {w.shape[0]} entries but the batch has {kernel.shape[0]}")
    if validate and not bool(weights_valid(w)):
        raise ValueError(WEIGHTS_MESSAGE)
    inv = 1.0 / w
    return kernel * inv[:, None] * inv[None, :]
