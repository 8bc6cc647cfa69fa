"""GNQ of each text against a companion set, from the texts' sketches (DESIGN.md §9).

S is the [n, m] matrix of the sketches s_j = Π g_j of n texts.  GNQ_j against the n − 1 others is

    GNQ_j = s_jᵀ (Σ_{i≠j} s_i s_iᵀ + λ I_m)⁻¹ s_j.

* n ≤ m: the n × n Gram K = S Sᵀ and the ordinary leave-one-out solve (``solve.gnq_from_kernel``).
* n > m (more texts than sketch dimensions): the m × m system.  With A = SᵀS + λI_m and
  q_j = s_jᵀ A⁻¹ s_j, Sherman–Morrison on A − s_j s_jᵀ gives GNQ_j = q_j / (1 − q_j), and the
  push-through identity S(SᵀS + λI)⁻¹Sᵀ = SSᵀ(SSᵀ + λI)⁻¹ = K M says q_j is the same h_j the
  n × n solve uses: both paths give the same numbers.  q_j = ‖L⁻¹ s_j‖² with A = L Lᵀ.
  1 − q_j is a difference, so GNQ_j's relative rounding is about 1e-16 · (1 + GNQ_j).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gnq_core.engine.solve import LAM_ABSOLUTE, GNQNumericalError, check_lam_mode, gnq_from_kernel

__all__ = ["CompanionSolution", "companion_gnq", "sketch_gram", "sketch_space_gnq"]

GRAM_CHUNK = 512  # rows of S cast to float64 at a time for the Gram


@dataclass
class CompanionSolution:
    gnq: torch.Tensor  # float64 [n]
    self_influence: torch.Tensor  # float64 [n]: ‖s_j‖², the sketched K_jj
    lam: float  # the ridge used (λ, or λ · mean K_jj in relative mode)
    condition: float  # of K + λI_n
    space: str  # "texts" (the n × n Gram) or "sketch" (the m × m system)


def sketch_gram(S: torch.Tensor, chunk: int = GRAM_CHUNK) -> torch.Tensor:
    """K = S Sᵀ in float64, S cast a block of rows at a time (S may be held in float32)."""
    n = S.shape[0]
    K = torch.empty(n, n, dtype=torch.float64, device=S.device)
    for i in range(0, n, chunk):
        Si = S[i:i + chunk].to(torch.float64)
        for j in range(0, i + 1, chunk):
            block = Si @ S[j:j + chunk].to(torch.float64).T
            K[i:i + chunk, j:j + chunk] = block
            K[j:j + chunk, i:i + chunk] = block.T
    return K


def sketch_space_gnq(S: torch.Tensor, lam: float, chunk: int = GRAM_CHUNK) -> tuple[torch.Tensor, float]:
    """GNQ of every row of S against the others through the m × m system A = SᵀS + λI (module
    docstring); also the condition number of K + λI_n (λ_max(A)/λ when n > m: K has rank ≤ m)."""
    if lam <= 0:
        raise ValueError(f"lam must be > 0, got {lam}")
    n, m = S.shape
    A = torch.zeros(m, m, dtype=torch.float64, device=S.device)
    for i in range(0, n, chunk):
        Si = S[i:i + chunk].to(torch.float64)
        A += Si.T @ Si
    if not bool(torch.isfinite(A).all()):
        raise GNQNumericalError("the sketches have NaN/Inf entries (non-finite loss or gradient)")
    A.diagonal().add_(lam)
    L, info = torch.linalg.cholesky_ex(A)
    if int(info) != 0:
        raise GNQNumericalError(f"SᵀS + λI is not positive definite (λ={lam:g})")
    q = torch.empty(n, dtype=torch.float64, device=S.device)
    for i in range(0, n, chunk):
        Z = torch.linalg.solve_triangular(L, S[i:i + chunk].to(torch.float64).T, upper=False)
        q[i:i + chunk] = (Z * Z).sum(dim=0)
    top = float(torch.linalg.eigvalsh(A)[-1])
    smallest = lam if n > m else float(torch.linalg.eigvalsh(sketch_gram(S) + lam * torch.eye(
        n, dtype=torch.float64, device=S.device))[0])
    return q / (1 - q), top / smallest


def companion_gnq(S: torch.Tensor, lam: float, lam_mode: str = "absolute") -> CompanionSolution:
    """GNQ of each of the n texts of S [n, m] against the other n − 1 (n ≥ 2), by the cheaper
    system: the n × n Gram when n ≤ m, else the m × m one.  ``lam_mode`` as in ``effective_lam``
    (relative: λ · the set's mean ‖s_j‖²)."""
    n, m = S.shape
    if n < 2:
        raise ValueError(f"a companion set needs at least 2 texts, got {n}")
    norms = torch.zeros(n, dtype=torch.float64, device=S.device)
    for i in range(0, n, GRAM_CHUNK):
        Si = S[i:i + GRAM_CHUNK].to(torch.float64)
        norms[i:i + GRAM_CHUNK] = (Si * Si).sum(dim=1)
    lam_eff = float(lam)  # as solve.effective_lam, without forming the n × n diagonal
    if check_lam_mode(lam_mode) != LAM_ABSOLUTE and float(norms.mean()) > 0:
        lam_eff = float(lam) * float(norms.mean())
    if n <= m:
        solution = gnq_from_kernel(sketch_gram(S), lam_eff)
        return CompanionSolution(solution.gnq, norms, lam_eff, solution.condition, "texts")
    gnq, condition = sketch_space_gnq(S, lam_eff)
    return CompanionSolution(gnq, norms, lam_eff, condition, "sketch")
