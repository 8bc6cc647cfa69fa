"""Shared test helpers: float64 by default, error measures, tiny models built from config."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def float64_default():
    """Kernel paths are compared with the reference in float64 (rel. error ≤ 1e-9)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max_j |a_j − b_j| / max(|b_j|, tiny): elementwise relative error."""
    a, b = a.to(torch.float64), b.to(torch.float64)
    return ((a - b).abs() / b.abs().clamp_min(1e-300)).max().item()


def kernel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative error of a B×B kernel, normalised by its largest entry."""
    a, b = a.to(torch.float64), b.to(torch.float64)
    return ((a - b).abs().max() / b.abs().max()).item()


TOL = 1e-9
PATHS = ["auto", "ghost", "materialize"]
