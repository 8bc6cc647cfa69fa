"""GNQ Audit engine: exact per-example gradient uniqueness for PyTorch / Hugging Face models."""

from .auditor import BatchDimensionError, GNQAuditor, GNQResult
from .coverage import Coverage, UncoveredParametersError
from .kernels import UnsupportedModuleError, register
from .losses import lm_token_mean_weights, per_example_lm_loss
from .reference import exact_gnq
from .solve import GNQNumericalError, gnq_from_kernel

__version__ = "0.1.0"

__all__ = [
    "BatchDimensionError",
    "Coverage",
    "GNQAuditor",
    "GNQNumericalError",
    "GNQResult",
    "UncoveredParametersError",
    "UnsupportedModuleError",
    "exact_gnq",
    "gnq_from_kernel",
    "lm_token_mean_weights",
    "per_example_lm_loss",
    "register",
]
