"""The engine: exact per-example gradient kernels, GNQ's solve and the auditor that drives them
(``GNQAuditor``: one door for the batch of a micro-batch or an optimizer step, on one rank or
across torch.distributed ranks).

Imports nothing from the layers above it (sources, results, pipelines, analysis, cli).  Its public
names, imported on first use:
"""

from gnq_core._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    ".auditor": ("BATCHES", "SCOPES", "GNQAuditor", "GNQResult"),
    ".batch": ("BatchDimensionError",),
    ".coverage": ("Coverage", "UncoveredParametersError"),
    ".distributed": ("DistributedGNQResult", "Scope", "Strategy"),
    ".kernels": ("Kernel", "UnsupportedModuleError", "kernel_for", "register"),
    ".conventions": ("IGNORE_INDEX", "LAM_ABSOLUTE", "LAM_MODES", "LAM_RELATIVE", "LOSS_CONVENTIONS",
                     "TOKEN_MEAN", "TOKEN_SUM", "check_lam_mode", "check_loss_convention"),
    ".losses": ("lm_token_mean_weights", "per_example_lm_loss"),
    ".reference": ("exact_gnq", "per_example_gradients"),
    ".selfcheck": ("run_selfcheck",),
    ".sketch": ("SketchSpec", "Sketcher", "sketched_gnq"),
    ".solve": ("GNQNumericalError", "gnq_from_kernel"),
    ".window": ("WindowBudgetError", "WindowResult"),
    ".window_ddp": ("DistributedWindowResult",),
})
