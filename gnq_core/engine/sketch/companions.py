"""GNQ of each text against a companion set, from the texts' sketches (DESIGN.md §9).

S is the [n, m] matrix of the sketches s_j = Π g_j of n texts.  GNQ_j against the n − 1 others is

    GNQ_j = s_jᵀ (Σ_{i≠j} s_i s_iᵀ + λ I_m)⁻¹ s_j.

* n ≤ m: the n × n Gram K = S Sᵀ and the ordinary leave-one-out solve (``solve.gnq_from_kernel``).
* n > m (more texts than sketch dimensions): the m × m system.  With A = SᵀS + λI_m and
  q_j = s_jᵀ A⁻¹ s_j, Sherman–Morrison on A − s_j s_jᵀ gives GNQ_j = q_j / (1 − q_j), and the
  push-through identity S(SᵀS + λI)⁻¹Sᵀ = SSᵀ(SSᵀ + λI)⁻¹ = K M says q_j is the same h_j the
  n × n solve uses: both paths give the same numbers.  q_j = ‖L⁻¹ s_j‖² with A = L Lᵀ.
  1 − q_j is a difference, so GNQ_j's relative rounding is about 1e-16 · (1 + GNQ_j).
* Streamed (``SketchSystem``): the m × m path without S.  A first pass adds each micro-batch's
  s_j s_jᵀ into A (float64; across torch.distributed ranks, each rank its share, then one
  all-reduce), ``factor`` turns A + λI into its Cholesky factor in place, and a second pass
  recomputes each text's sketch and takes q_j from it: memory one m × m matrix and a micro-batch,
  whatever n.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gnq_core.engine.math.conventions import LAM_ABSOLUTE, check_lam_mode
from gnq_core.engine.math.solve import GNQNumericalError

__all__ = ["CompanionSolution", "SketchFactor", "SketchRows", "SketchSystem", "companion_gnq",
           "held_bytes", "kernel_gnq", "sketch_gram", "sketch_space_gnq", "streamed_bytes"]

GRAM_CHUNK = 512  # rows of S cast to float64 at a time for the Gram
EXACT_CONDITION = 4096  # systems up to this size get their exact condition number (eigvalsh)
POWER_STEPS = 100  # larger ones: power iterations (an estimate)


@dataclass
class CompanionSolution:
    gnq: torch.Tensor  # float64 [n]
    self_influence: torch.Tensor  # float64 [n]: ‖s_j‖², the sketched K_jj
    lam: float  # the ridge used (λ, or λ · mean K_jj in relative mode)
    condition: float  # of K + λI_n
    space: str  # "texts" (the n × n Gram) or "sketch" (the m × m system)


class SketchRows:
    """The [n, m] sketches of a companion set, filled a micro-batch at a time into one tensor
    (the micro-batches' parts are let go as they come: one copy of the set's sketches is held).

    Rows come with the widths of the parameter keys they were laid out by (sorted keys, as
    ``SketchBatch.matrix``); a key first seen in a later micro-batch (a parameter the earlier ones
    did not use) widens the earlier rows with zeros in its columns."""

    def __init__(self, n: int) -> None:
        self.n, self.filled = n, 0
        self.widths: dict[str, int] = {}
        self._S: torch.Tensor | None = None

    def put(self, rows: torch.Tensor, widths: dict[str, int]) -> None:
        if self.filled + rows.shape[0] > self.n:
            raise ValueError(f"{self.filled + rows.shape[0]} sketch rows for a set of {self.n}")
        if rows.shape[1] != sum(widths.values()):
            raise ValueError(f"rows of width {rows.shape[1]} for keys of total width {sum(widths.values())}")
        if self._S is None:
            self._S = rows.new_zeros(self.n, rows.shape[1])
        elif widths != self.widths:
            self._S = _relayout(self._S, self.widths, widths)
        self.widths = dict(widths)
        self._S[self.filled:self.filled + rows.shape[0]] = rows
        self.filled += rows.shape[0]

    def take(self) -> torch.Tensor:
        """The [n, m] sketches (all rows put); the holder lets them go."""
        if self._S is None or self.filled != self.n:
            raise ValueError(f"{self.filled} of {self.n} sketch rows were put")
        S, self._S = self._S, None
        return S


def _relayout(S: torch.Tensor, old: dict[str, int], new: dict[str, int]) -> torch.Tensor:
    """S's columns laid out by ``old``'s sorted keys, moved to ``new``'s (a superset; zeros)."""
    if any(new.get(k) != w for k, w in old.items()):
        raise ValueError("a parameter's sketch width changed within a companion set")
    out = S.new_zeros(S.shape[0], sum(new.values()))
    starts, at = {}, 0
    for key in sorted(new):
        starts[key], at = at, at + new[key]
    at = 0
    for key in sorted(old):
        out[:, starts[key]:starts[key] + old[key]] = S[:, at:at + old[key]]
        at += old[key]
    return out


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


def _condition(A: torch.Tensor, smallest: float | None = None) -> float:
    """2-norm condition number of the SPD matrix A (``smallest``: its smallest eigenvalue when
    known).  Exact (eigvalsh) up to ``EXACT_CONDITION`` rows; above, the extreme eigenvalues by
    ``POWER_STEPS`` power iterations (λ_max from below, λ_min from 1/λ_max(A⁻¹) via the Cholesky
    factor): an estimate, recorded for information only."""
    if A.shape[0] <= EXACT_CONDITION:
        eig = torch.linalg.eigvalsh(A)
        return float(eig[-1] / (eig[0] if smallest is None else smallest))
    top = _power(lambda v: A @ v, A.shape[0], A)
    if smallest is None:
        L = torch.linalg.cholesky(A)
        smallest = 1.0 / _power(lambda v: torch.cholesky_solve(v[:, None], L)[:, 0], A.shape[0], A)
    return top / smallest


def _power(apply, n: int, like: torch.Tensor) -> float:
    v = torch.randn(n, dtype=torch.float64, device=like.device, generator=torch.Generator(like.device)
                    .manual_seed(0))
    value = 0.0
    for _ in range(POWER_STEPS):
        w = apply(v / v.norm())
        value, v = float(w.norm()), w
    return value


def kernel_gnq(K: torch.Tensor, lam: float, chunk: int = GRAM_CHUNK) -> tuple[torch.Tensor, float]:
    """``solve.gnq_from_kernel``'s numbers with three n × n matrices at a time (K, L, M; K is
    overwritten): h_j = Σ_k K_jk M_jk by row blocks, M_jj = (1 − h_j)/λ, GNQ_j = h_j / (λ M_jj)."""
    if not bool(torch.isfinite(K).all()):
        raise GNQNumericalError("the sketches have NaN/Inf entries (non-finite loss or gradient)")
    n = K.shape[0]
    K.diagonal().add_(lam)  # K + λI, in place
    L, info = torch.linalg.cholesky_ex(K)
    if int(info) != 0:
        raise GNQNumericalError(f"K + λI is not positive definite (λ={lam:g})")
    condition = _condition(K) if n <= EXACT_CONDITION else None
    M = torch.cholesky_inverse(L)
    del L
    if condition is None:
        top = _power(lambda v: K @ v, n, K)
        condition = top * _power(lambda v: M @ v, n, M)
    K.diagonal().sub_(lam)
    h = torch.empty(n, dtype=torch.float64, device=K.device)
    for i in range(0, n, chunk):
        h[i:i + chunk] = (K[i:i + chunk] * M[i:i + chunk]).sum(dim=1)
    return h / (lam * M.diagonal()), condition


def sketch_space_gnq(S: torch.Tensor, lam: float, chunk: int = GRAM_CHUNK) -> tuple[torch.Tensor, float]:
    """GNQ of every row of S against the others through the m × m system A = SᵀS + λI (module
    docstring); also the condition number of K + λI_n (n > m: λ_max(A)/λ, K has rank ≤ m)."""
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
    # K + λI_n has A's eigenvalues and, when n > m, λ (n − m times): its smallest is then λ
    if n > m:
        condition = _condition(A, lam)
    else:  # K + λI_n is full rank: its own spectrum (tests; companion_gnq takes the n × n path here)
        K = sketch_gram(S)
        K.diagonal().add_(lam)
        condition = _condition(K)
    return q / (1 - q), condition


def companion_gnq(S: torch.Tensor, lam: float, lam_mode: str = "absolute") -> CompanionSolution:
    """GNQ of each of the n texts of S [n, m] against the other n − 1 (n ≥ 2), by the cheaper
    system: the n × n Gram when n ≤ m, else the m × m one.  ``lam_mode`` as in ``effective_lam``
    (relative: λ · the set's mean ‖s_j‖²).  The n × n path needs S only for the Gram: a caller
    that passes S without keeping a reference lets its n·m numbers go before the solve."""
    n, m = S.shape
    if n < 2:
        raise ValueError(f"a companion set needs at least 2 texts, got {n}")
    norms = torch.zeros(n, dtype=torch.float64, device=S.device)
    for i in range(0, n, GRAM_CHUNK):
        Si = S[i:i + GRAM_CHUNK].to(torch.float64)
        norms[i:i + GRAM_CHUNK] = (Si * Si).sum(dim=1)
    del Si  # a float64 block of up to GRAM_CHUNK sketches, not to be held through the solve
    lam_eff = float(lam)  # as solve.effective_lam, without forming the n × n diagonal
    if check_lam_mode(lam_mode) != LAM_ABSOLUTE and float(norms.mean()) > 0:
        lam_eff = float(lam) * float(norms.mean())
    if n <= m:
        K = sketch_gram(S)
        del S
        gnq, condition = kernel_gnq(K, lam_eff)
        return CompanionSolution(gnq, norms, lam_eff, condition, "texts")
    gnq, condition = sketch_space_gnq(S, lam_eff)
    return CompanionSolution(gnq, norms, lam_eff, condition, "sketch")


def held_bytes(n: int, m: int, row_bytes: int = 4) -> int:
    """The n × n path's peak for n texts of m numbers: the sketches (``row_bytes`` a number, until
    K exists) and three n × n float64 matrices in the solve."""
    return n * m * row_bytes + 3 * 8 * n * n


def streamed_bytes(m: int) -> int:
    """The streamed path's: one m × m float64 matrix (A, then its factor in its place)."""
    return 8 * m * m


class SketchSystem:
    """A = Σ_j s_j s_jᵀ over a companion set's sketches (m × m, float64), added a micro-batch at a
    time, so that the sketches need not be held; ``n`` texts so far.

    Rows wait until ``FLUSH_ROWS`` have come (a rank-16 update would read and write all of A for
    few FLOPs), then go in as one rank-k update: on the CPU BLAS's syrk, which forms only A's
    lower triangle (half the FLOPs; the factor, the trace and the condition number read only
    that triangle); on a GPU the whole product."""

    FLUSH_ROWS = 512

    def __init__(self, m: int, device: torch.device | str = "cpu", A: torch.Tensor | None = None,
                 n: int = 0) -> None:
        self._A = torch.zeros(m, m, dtype=torch.float64, device=device) if A is None else A
        self.n = n
        self._pending: list[torch.Tensor] = []
        self._waiting = 0

    @property
    def A(self) -> torch.Tensor | None:
        """A with every row added (its lower triangle at least); None once factored."""
        self._flush()
        return self._A

    def add(self, rows: torch.Tensor) -> None:
        """Add rows [b, m] of sketches (any float dtype; float64 in the sum)."""
        if rows.shape[1] != self._A.shape[0]:
            raise ValueError(f"sketch rows of width {rows.shape[1]} for a system of {self._A.shape[0]}")
        self._pending.append(rows)
        self._waiting += rows.shape[0]
        self.n += rows.shape[0]
        if self._waiting >= self.FLUSH_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        R = torch.cat(self._pending).to(device=self._A.device, dtype=torch.float64)
        self._pending, self._waiting = [], 0
        if self._A.device.type != "cpu":
            self._A.addmm_(R.T, R)
            return
        from scipy.linalg.blas import dsyrk

        # A's C-order memory is Aᵀ in Fortran order and R's is Rᵀ: syrk's upper triangle of
        # Rᵀ (Rᵀ)ᵀ in Fortran is the lower triangle of RᵀR in C order, added in place
        dsyrk(1.0, R.numpy().T, beta=1.0, c=self._A.numpy().T, trans=0, lower=0, overwrite_c=1)

    def all_reduce(self, group=None) -> None:
        """Sum every rank's A and n (torch.distributed; each rank added its own share of the texts)."""
        import torch.distributed as dist

        A = self.A
        summed = A.cpu()  # the ranks talk over gloo (pipelines/ranks.py): on the CPU
        count = torch.tensor([float(self.n)], dtype=torch.float64)
        dist.all_reduce(summed, group=group)
        dist.all_reduce(count, group=group)
        if summed is not A:
            A.copy_(summed)
        self.n = int(count.item())

    def lam(self, lam: float, lam_mode: str = LAM_ABSOLUTE) -> float:
        """λ of the solve: ``lam``, or relative: λ · the set's mean ‖s_j‖² (trace(A) / n)."""
        mean = float(self.A.diagonal().sum()) / max(self.n, 1)
        if check_lam_mode(lam_mode) != LAM_ABSOLUTE and mean > 0:
            return float(lam) * mean
        return float(lam)

    def factor(self, lam: float) -> SketchFactor:
        """The Cholesky factor of A + λI, formed in A's memory (A is gone after this), and the
        condition number of K + λI_n (``sketch_space_gnq``'s)."""
        if lam <= 0:
            raise ValueError(f"lam must be > 0, got {lam}")
        if self.n < 2:
            raise ValueError(f"a companion set needs at least 2 texts, got {self.n}")
        A, m = self.A, self._A.shape[0]
        if not all(bool(torch.isfinite(A[i:i + GRAM_CHUNK]).all()) for i in range(0, m, GRAM_CHUNK)):
            raise GNQNumericalError("the sketches have NaN/Inf entries (non-finite loss or gradient)")
        A.diagonal().add_(lam)
        condition = _system_condition(A, lam, self.n)
        self._A = None  # type: ignore[assignment]  (the factor takes its memory)
        return SketchFactor(_cholesky_in_place(A, lam), lam, condition, m)


@dataclass
class SketchFactor:
    """L with L Lᵀ = SᵀS + λI: q_j = ‖L⁻¹ s_j‖² and GNQ_j = q_j / (1 − q_j) of any row of the set."""

    L: torch.Tensor
    lam: float
    condition: float
    m: int

    def gnq(self, rows: torch.Tensor) -> torch.Tensor:
        """GNQ [b] (float64) of rows [b, m] of the set the factor was formed from."""
        Z = torch.linalg.solve_triangular(self.L, rows.to(device=self.L.device, dtype=torch.float64).T,
                                          upper=False)
        q = (Z * Z).sum(dim=0)
        return q / (1 - q)


def _system_condition(A: torch.Tensor, lam: float, n: int) -> float:
    """Condition number of K + λI_n from A = SᵀS + λI (its lower triangle): λ_max(A) over λ when
    n > m (K has rank ≤ m); n ≤ m: over the n-th largest eigenvalue of A (exact up to
    ``EXACT_CONDITION``; above, over λ: an upper bound)."""
    m = A.shape[0]
    if m <= EXACT_CONDITION:
        eig = torch.linalg.eigvalsh(A, UPLO="L")
        return float(eig[-1] / (lam if n > m else eig[m - n]))
    if A.device.type != "cpu":
        return _power(lambda v: A @ v, m, A) / lam
    from scipy.linalg.blas import dsymv

    F = A.numpy().T  # the lower triangle in C order is Fortran's upper
    return _power(lambda v: torch.from_numpy(dsymv(1.0, F, v.numpy(), lower=0)), m, A) / lam


def _cholesky_in_place(A: torch.Tensor, lam: float) -> torch.Tensor:
    """The lower Cholesky factor of the symmetric A, in A's own memory on the CPU (LAPACK potrf:
    no second m × m matrix; at m = 16,384 that is 2 GiB); on a GPU torch's, beside A."""
    if A.device.type != "cpu":
        L, info = torch.linalg.cholesky_ex(A)
        if int(info) != 0:
            raise GNQNumericalError(f"SᵀS + λI is not positive definite (λ={lam:g})")
        return L
    from scipy.linalg import lapack

    # A is symmetric: its C-order memory is A in Fortran order too.  potrf's upper factor U
    # (A = UᵀU, Fortran) read back in C order is L = Uᵀ, lower, with A = L Lᵀ.
    U, info = lapack.dpotrf(A.numpy().T, lower=0, clean=1, overwrite_a=1)
    if info != 0:
        raise GNQNumericalError(f"SᵀS + λI is not positive definite (λ={lam:g})")
    return torch.from_numpy(U.T)
