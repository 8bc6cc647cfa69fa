"""GNQ Audit engine: exact per-example gradient uniqueness for PyTorch / Hugging Face models."""

from gnq_core.engine.auditor import BatchDimensionError, GNQAuditor, GNQResult
from gnq_core.engine.coverage import Coverage, UncoveredParametersError
from gnq_core.engine.kernels import UnsupportedModuleError, register
from gnq_core.engine.losses import lm_token_mean_weights, per_example_lm_loss
from gnq_core.engine.reference import exact_gnq
from gnq_core.engine.solve import GNQNumericalError, gnq_from_kernel

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
