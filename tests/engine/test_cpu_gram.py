"""The CPU Gram kernel (engine/math/cpu_gram.py): the upper triangle of F Fᵀ, exact in float64."""

from __future__ import annotations

import contextlib

import pytest
import torch

from gnq_core.engine.math import cpu_gram
from gnq_core.engine.math.cpu_gram import upper_gram_


@contextlib.contextmanager
def threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_the_kernel_compiles_here():
    assert cpu_gram._kernel() is not None  # numba is a dependency: a missing kernel is a defect


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 17, 20, 25])
def test_upper_triangle_matches_the_matmul(rows, dtype):
    g = torch.Generator().manual_seed(rows * 31 + (dtype == torch.float32))
    F = torch.randn(rows, int(torch.randint(0, 3000, (1,), generator=g)), generator=g, dtype=dtype)
    start = torch.randn(rows, rows, generator=g, dtype=dtype)
    acc = start.clone()
    with threads(1):
        assert upper_gram_(acc, F)
    expected = (start + F @ F.T).triu()
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-3}
    torch.testing.assert_close(acc.triu(), expected, **tol)
    torch.testing.assert_close(acc.tril(-1), start.tril(-1), rtol=0, atol=0)  # untouched below


def test_non_finite_values_reach_the_gram():
    F = torch.randn(8, 100, dtype=torch.float64)
    F[3, 7] = float("nan")
    acc = torch.zeros(8, 8, dtype=torch.float64)
    with threads(1):
        assert upper_gram_(acc, F)
    assert acc[3, 3].isnan() and acc[0, 3].isnan() and acc[3, 7].isnan() and not acc[0, 1].isnan()


def test_where_it_does_not_apply_it_says_so():
    acc = torch.zeros(4, 4, dtype=torch.float64)
    with threads(1):
        assert not upper_gram_(acc, torch.randn(4, 10, dtype=torch.float64).t().contiguous().t())
        assert not upper_gram_(acc, torch.randn(4, 10, dtype=torch.float32))  # dtype mismatch
        assert not upper_gram_(acc.half(), torch.randn(4, 10).half())
    with threads(cpu_gram.MAX_THREADS + 1):
        assert not upper_gram_(acc, torch.randn(4, 10, dtype=torch.float64))
    assert acc.abs().sum() == 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("rows", [1, 4, 5, 8, 9, 13, 16, 17, 24])
def test_row_sums_ride_on_the_gram_pass(rows, dtype):
    """With ``sums`` the kernel also adds Σ_j F_j (full 8-row blocks in the Gram's own pass, a short
    last block's rows after it): the fused path's weight gradient, from fresh random rows."""
    g = torch.Generator().manual_seed(rows * 17 + (dtype == torch.float32))
    F = torch.randn(rows, int(torch.randint(1, 3000, (1,), generator=g)), generator=g, dtype=dtype)
    start = torch.randn(F.shape[1], generator=g, dtype=dtype)
    sums, acc = start.clone(), torch.zeros(rows, rows, dtype=dtype)
    with threads(1):
        assert upper_gram_(acc, F, sums)
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-3}
    torch.testing.assert_close(sums, start + F.sum(0), **tol)
    torch.testing.assert_close(acc.triu(), (F @ F.T).triu(), **tol)
    F[rows - 1, 0] = float("nan")
    with threads(1):
        assert upper_gram_(acc, F, sums)
    assert sums[0].isnan() and not sums[1:].isnan().any()


def test_row_sums_of_another_shape_or_dtype_are_refused():
    acc, F = torch.zeros(8, 8, dtype=torch.float64), torch.randn(8, 10, dtype=torch.float64)
    with threads(1):
        assert not upper_gram_(acc, F, torch.zeros(9, dtype=torch.float64))
        assert not upper_gram_(acc, F, torch.zeros(10, dtype=torch.float32))
    assert acc.abs().sum() == 0
