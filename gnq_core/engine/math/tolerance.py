"""How close a kernel path must come to the reference: a bound derived from the problem, not a
fixed number.

A fixed tolerance (1e-9) passed on one CPU and failed on another: the same honest computation
rounds differently where the BLAS sums in another order, and how far that moves GNQ depends on
the problem's conditioning.  Every honest source of difference is expressed here as an
equivalent perturbation of the B×B kernel K, then carried through the GNQ solve's first-order
sensitivity (u: the unit roundoff of the compared dtype, 2⁻⁵³ in float64; γ_n = n u / (1 − n u)):

1. **The Gram.**  K_jk = Σ_p g_jp g_kp is a reduction of length P (the parameters) that each path
   sums in its own order (blocked BLAS, the factored ghost products, the fused sums):
   |δK_jk| ≤ γ_P Σ_p |g_jp g_kp| ≤ γ_P ‖g_j‖ ‖g_k‖ ≤ γ_P max|K| (Cauchy–Schwarz; K is PSD).  Two
   computations, and the gradients' own sums: ``GRAM_FACTOR`` γ_P relative to max|K|.
2. **Rounding inside the model**, which only the problem sees: the per-example gradients are
   themselves sums (over positions, over a module's repeated uses) that may cancel, and a family
   that computes parts of a float64 model in float32 (norms, softmax, routers) rounds them at
   float32's u, in another order wherever a per-example replay runs them at another batch shape.
   It is measured, not guessed (``noise``), as the larger of how far two honest references
   differ (a batch forward and one example at a time) and ``rounding_sensitivity``: how far the
   kernel moves when every parameter is perturbed by the rounding of the longest dot product it
   enters (γ_d relative, random signs; backward stability makes each op's rounding such a
   perturbation, so this is the problem's condition times its rounding).  It counts
   ``NOISE_FACTOR`` times.
3. **The solves.**  A Cholesky solve is backward stable: the exact result for K + ΔK with
   ‖ΔK‖₂ ≤ γ_{B+1} B ‖K + λI‖₂, for the path's solve and the reference's.

With E the total (‖δK‖₂ ≤ B max|δK_jk| for the entrywise terms), GNQ_j = (K_jj − k_jᵀ A_j⁻¹ k_j)/λ,
A_j = K_{−j} + λI, moves by at most E (1 + ‖A_j⁻¹ k_j‖)² / λ to first order (twice that allowed
for the second): relative to |GNQ_j| the bound grows with the cancellation (GNQ_j ≪ K_jj / λ) and
the conditioning (small λ against K).  A real error, a dropped or mis-scaled term, moves K by its
own size, orders of magnitude above these bounds (tests/engine/test_tolerances.py shows both).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

# Two computations of the Gram (the path's and the reference's), each within γ_P of the exact Gram
# of its own gradients, and those gradients each rounded in their own sums (over positions and a
# module's repeated uses; the engine forms them as factored products): 16 γ_P.  Real rounding stays
# far below this worst case (~1e-15 relative at P ~ 10⁴ on most families); the largest seen, a
# looped transformer whose layers run several times, is 3.5e-11 at P = 70,000 (4 γ_P = 3.1e-11).
GRAM_FACTOR = 16.0
NOISE_FACTOR = 10.0  # the measured reference-to-reference difference, with room for the replay's own
SECOND_ORDER = 2.0  # the first-order bound of the solve, doubled
_TINY = torch.finfo(torch.float64).tiny


def unit_roundoff(dtype: torch.dtype = torch.float64) -> float:
    return torch.finfo(dtype).eps / 2


def gamma(n: int, u: float) -> float:
    """γ_n = n u / (1 − n u): the relative error bound of a sum of n terms (Higham, §3.1)."""
    nu = n * u
    if nu >= 1:
        return float("inf")
    return nu / (1 - nu)


@dataclass(frozen=True)
class Exactness:
    """A path's kernel and GNQ against the reference, with their derived bounds."""

    kernel_error: float  # max |K − K_ref| / max |K_ref|
    kernel_bound: float
    gnq_error: torch.Tensor  # |GNQ_j − GNQ_ref_j| / |GNQ_ref_j|, per example
    gnq_bound: torch.Tensor

    @property
    def ok(self) -> bool:
        return bool(self.kernel_error <= self.kernel_bound and (self.gnq_error <= self.gnq_bound).all())

    @property
    def error(self) -> float:
        """The largest relative error (kernel or GNQ), as the family matrix has always reported."""
        return max(self.kernel_error, float(self.gnq_error.max()))

    def describe(self) -> str:
        j = int((self.gnq_error / self.gnq_bound).argmax())
        return (f"kernel error {self.kernel_error:.2e} (bound {self.kernel_bound:.2e}), GNQ error "
                f"{float(self.gnq_error[j]):.2e} (bound {float(self.gnq_bound[j]):.2e}, example {j})")


def kernel_bound(n_reduce: int, noise: float = 0.0, dtype: torch.dtype = torch.float64) -> float:
    """The relative (to max|K|) kernel difference two honest computations may have: the Gram's
    reduction of length ``n_reduce`` (the parameters) and the measured ``noise`` of the model."""
    return max(GRAM_FACTOR * gamma(n_reduce, unit_roundoff(dtype)), NOISE_FACTOR * noise)


def gnq_bound(K_ref: torch.Tensor, gnq_ref: torch.Tensor, lam: float, kernel_rel: float) -> torch.Tensor:
    """Per example, the relative GNQ difference a kernel difference of ``kernel_rel`` (relative to
    max|K|) and the two solves' rounding may cause (the module doc, 3)."""
    K = K_ref.to(torch.float64)
    B = K.shape[0]
    u = unit_roundoff(K.dtype)
    norm = float(torch.linalg.matrix_norm(K, ord=2))
    E = B * kernel_rel * float(K.abs().max()) + 2 * gamma(B + 1, u) * B * (norm + lam)
    out = torch.empty(B, dtype=torch.float64)
    eye = torch.eye(B - 1, dtype=torch.float64)
    for j in range(B):
        rest = [k for k in range(B) if k != j]
        x = torch.linalg.solve(K[rest][:, rest] + lam * eye, K[rest, j]) if rest else K.new_zeros(0)
        out[j] = SECOND_ORDER * E * (1 + float(torch.linalg.vector_norm(x))) ** 2 / lam
    return out / gnq_ref.to(torch.float64).abs().clamp_min(_TINY)


def exactness(kernel: torch.Tensor, gnq: torch.Tensor, K_ref: torch.Tensor, gnq_ref: torch.Tensor,
              lam: float, n_reduce: int, noise: float = 0.0, floor: float = 0.0) -> Exactness:
    """Compare a path's ``kernel`` and ``gnq`` with the reference's, each against its derived bound
    (``n_reduce``: the Gram's reduction length, the number of parameters; ``noise``: the measured
    reference-to-reference kernel difference; ``floor``: a stated lower bound on the kernel's)."""
    K_ref, gnq_ref = K_ref.to(torch.float64), gnq_ref.to(torch.float64)
    kernel_err = float((kernel.to(torch.float64) - K_ref).abs().max() / K_ref.abs().max())
    bound = max(kernel_bound(n_reduce, noise), floor)
    gnq_err = (gnq.to(torch.float64) - gnq_ref).abs() / gnq_ref.abs().clamp_min(_TINY)
    return Exactness(kernel_err, bound, gnq_err, torch.maximum(gnq_bound(K_ref, gnq_ref, lam, bound),
                                                                torch.full_like(gnq_err, floor)))


def kernel_noise(G_a: torch.Tensor, G_b: torch.Tensor) -> float:
    """How far two honest computations of the same per-example gradients move the kernel,
    relative to its largest entry: the model's own rounding, as this machine does it."""
    G_a, G_b = G_a.to(torch.float64), G_b.to(torch.float64)
    K_a, K_b = G_a @ G_a.T, G_b @ G_b.T
    return float((K_a - K_b).abs().max() / K_a.abs().max())


def rounding_sensitivity(gradients: Callable[[], torch.Tensor], params: Sequence[torch.Tensor],
                         seed: int = 0) -> float:
    """How far the kernel of ``gradients()`` (per-example gradients, [B, P]) moves when each of
    ``params`` is multiplied by 1 ± γ_d (d: its longest dimension, the dot products it enters;
    random signs): the problem's sensitivity to its own rounding.  The parameters are restored."""
    before = gradients()
    saved = [p.detach().clone() for p in params]
    g = torch.Generator().manual_seed(seed)
    u = unit_roundoff(torch.float64)
    try:
        with torch.no_grad():
            for p in params:
                signs = torch.randint(0, 2, p.shape, generator=g).to(p.dtype) * 2 - 1
                p.mul_(1 + gamma(max(p.shape, default=1), u) * signs.to(p.device))
        after = gradients()
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved, strict=True):
                p.copy_(s)
    return kernel_noise(before, after)
