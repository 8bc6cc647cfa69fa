"""numba kernels behind ``cpu_gram`` (imported only when a CPU Gram first needs them).

The register kernels are unrolled by hand: each running sum is its own local variable, so LLVM
keeps them in vector registers and reads every element of F once per block."""

from __future__ import annotations

import numpy as np
from numba import njit

# reassociation lets LLVM vectorise the reductions; no "no NaN / no Inf" assumptions
_FLAGS = {"reassoc", "contract"}


@njit(cache=True, nogil=True, boundscheck=False, fastmath=_FLAGS)
def _diagonal8(F, r, out, sums):  # pragma: no cover - compiled
    """out[i, k] += <F[r[i]], F[r[k]]> for i <= k < 8; with a non-empty ``sums``, also
    sums[n] += Σ_i F[r[i], n] in the same pass (eight distinct rows only)."""
    with_sums = sums.shape[0] > 0
    f0, f1, f2, f3, f4, f5, f6, f7 = F[r[0]], F[r[1]], F[r[2]], F[r[3]], F[r[4]], F[r[5]], F[r[6]], F[r[7]]
    z = out[0, 0] - out[0, 0]
    a00 = a01 = a02 = a03 = a04 = a05 = a06 = a07 = a11 = a12 = a13 = a14 = a15 = a16 = a17 = z
    a22 = a23 = a24 = a25 = a26 = a27 = a33 = a34 = a35 = a36 = a37 = a44 = a45 = a46 = a47 = z
    a55 = a56 = a57 = a66 = a67 = a77 = z
    for n in range(F.shape[1]):
        x0, x1, x2, x3, x4, x5, x6, x7 = f0[n], f1[n], f2[n], f3[n], f4[n], f5[n], f6[n], f7[n]
        a00 += x0 * x0
        a01 += x0 * x1
        a02 += x0 * x2
        a03 += x0 * x3
        a04 += x0 * x4
        a05 += x0 * x5
        a06 += x0 * x6
        a07 += x0 * x7
        a11 += x1 * x1
        a12 += x1 * x2
        a13 += x1 * x3
        a14 += x1 * x4
        a15 += x1 * x5
        a16 += x1 * x6
        a17 += x1 * x7
        a22 += x2 * x2
        a23 += x2 * x3
        a24 += x2 * x4
        a25 += x2 * x5
        a26 += x2 * x6
        a27 += x2 * x7
        a33 += x3 * x3
        a34 += x3 * x4
        a35 += x3 * x5
        a36 += x3 * x6
        a37 += x3 * x7
        a44 += x4 * x4
        a45 += x4 * x5
        a46 += x4 * x6
        a47 += x4 * x7
        a55 += x5 * x5
        a56 += x5 * x6
        a57 += x5 * x7
        a66 += x6 * x6
        a67 += x6 * x7
        a77 += x7 * x7
        if with_sums:
            sums[n] += ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))
    out[0, 0] += a00
    out[0, 1] += a01
    out[0, 2] += a02
    out[0, 3] += a03
    out[0, 4] += a04
    out[0, 5] += a05
    out[0, 6] += a06
    out[0, 7] += a07
    out[1, 1] += a11
    out[1, 2] += a12
    out[1, 3] += a13
    out[1, 4] += a14
    out[1, 5] += a15
    out[1, 6] += a16
    out[1, 7] += a17
    out[2, 2] += a22
    out[2, 3] += a23
    out[2, 4] += a24
    out[2, 5] += a25
    out[2, 6] += a26
    out[2, 7] += a27
    out[3, 3] += a33
    out[3, 4] += a34
    out[3, 5] += a35
    out[3, 6] += a36
    out[3, 7] += a37
    out[4, 4] += a44
    out[4, 5] += a45
    out[4, 6] += a46
    out[4, 7] += a47
    out[5, 5] += a55
    out[5, 6] += a56
    out[5, 7] += a57
    out[6, 6] += a66
    out[6, 7] += a67
    out[7, 7] += a77


@njit(cache=True, nogil=True, boundscheck=False, fastmath=_FLAGS)
def _diagonal4(F, r, out):  # pragma: no cover - compiled
    """out[i, k] += <F[r[i]], F[r[k]]> for i <= k < 4."""
    f0, f1, f2, f3 = F[r[0]], F[r[1]], F[r[2]], F[r[3]]
    z = out[0, 0] - out[0, 0]
    a00 = a01 = a02 = a03 = a11 = a12 = a13 = a22 = a23 = a33 = z
    for n in range(F.shape[1]):
        x0, x1, x2, x3 = f0[n], f1[n], f2[n], f3[n]
        a00 += x0 * x0
        a01 += x0 * x1
        a02 += x0 * x2
        a03 += x0 * x3
        a11 += x1 * x1
        a12 += x1 * x2
        a13 += x1 * x3
        a22 += x2 * x2
        a23 += x2 * x3
        a33 += x3 * x3
    out[0, 0] += a00
    out[0, 1] += a01
    out[0, 2] += a02
    out[0, 3] += a03
    out[1, 1] += a11
    out[1, 2] += a12
    out[1, 3] += a13
    out[2, 2] += a22
    out[2, 3] += a23
    out[3, 3] += a33


@njit(cache=True, nogil=True, boundscheck=False, fastmath=_FLAGS)
def _cross4(F, rj, rk, out):  # pragma: no cover - compiled
    """out[i, k] += <F[rj[i]], F[rk[k]]> for a 4×4 tile."""
    g0, g1, g2, g3 = F[rj[0]], F[rj[1]], F[rj[2]], F[rj[3]]
    h0, h1, h2, h3 = F[rk[0]], F[rk[1]], F[rk[2]], F[rk[3]]
    z = out[0, 0] - out[0, 0]
    a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = a20 = a21 = a22 = a23 = a30 = a31 = a32 = z
    a33 = z
    for n in range(F.shape[1]):
        x0, x1, x2, x3 = g0[n], g1[n], g2[n], g3[n]
        y0, y1, y2, y3 = h0[n], h1[n], h2[n], h3[n]
        a00 += x0 * y0
        a01 += x0 * y1
        a02 += x0 * y2
        a03 += x0 * y3
        a10 += x1 * y0
        a11 += x1 * y1
        a12 += x1 * y2
        a13 += x1 * y3
        a20 += x2 * y0
        a21 += x2 * y1
        a22 += x2 * y2
        a23 += x2 * y3
        a30 += x3 * y0
        a31 += x3 * y1
        a32 += x3 * y2
        a33 += x3 * y3
    out[0, 0] += a00
    out[0, 1] += a01
    out[0, 2] += a02
    out[0, 3] += a03
    out[1, 0] += a10
    out[1, 1] += a11
    out[1, 2] += a12
    out[1, 3] += a13
    out[2, 0] += a20
    out[2, 1] += a21
    out[2, 2] += a22
    out[2, 3] += a23
    out[3, 0] += a30
    out[3, 1] += a31
    out[3, 2] += a32
    out[3, 3] += a33


@njit(cache=True, nogil=True, boundscheck=False)
def upper_gram(F, acc, sums):  # pragma: no cover - compiled
    """acc[j, k] += <F[j], F[k]> for j <= k, in blocks of 8 rows (a last block of 4 rows or
    fewer uses the 4-row kernel).  A short block repeats its last row; the products of the
    repeats are computed and not added.  A non-empty ``sums`` also gets Σ_j F[j] added: full
    blocks in their Gram's pass (F read once), a short last block's rows after it."""
    B = F.shape[0]
    none = sums[:0]
    blocks = (B + 7) // 8
    r = np.empty(8, np.int64)
    rj = np.empty(4, np.int64)
    rk = np.empty(4, np.int64)
    for b in range(blocks):
        start = b * 8
        width = 4 if B - start <= 4 else 8
        for i in range(width):
            r[i] = min(start + i, B - 1)
        local = np.zeros((8, 8), F.dtype)
        full = width == 8 and start + 8 <= B
        if width == 4:
            _diagonal4(F, r, local)
        else:
            _diagonal8(F, r, local, sums if full else none)
        if sums.shape[0] > 0 and not full:
            for j in range(start, B):
                for n in range(F.shape[1]):
                    sums[n] += F[j, n]
        for i in range(width):
            for k in range(i, width):
                if start + k < B:
                    acc[start + i, start + k] += local[i, k]
        for c in range(b + 1, blocks):
            for hj in range(0, 8, 4):
                for hk in range(0, 8, 4):
                    for i in range(4):
                        rj[i] = min(start + hj + i, B - 1)
                        rk[i] = min(c * 8 + hk + i, B - 1)
                    if start + hj >= B or c * 8 + hk >= B:
                        continue
                    tile = np.zeros((4, 4), F.dtype)
                    _cross4(F, rj, rk, tile)
                    for i in range(4):
                        for k in range(4):
                            if start + hj + i < B and c * 8 + hk + k < B:
                                acc[start + hj + i, c * 8 + hk + k] += tile[i, k]
