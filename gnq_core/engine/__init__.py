"""The engine: exact per-example gradient kernels, GNQ's solve and the auditor that drives them
(``GNQAuditor``: one door for the batch of a micro-batch or an optimizer step, on one rank or
across torch.distributed ranks).

Imports nothing from the layers above it (sources, results, pipelines, analysis, cli).  Its public
names, imported on first use:
"""

from gnq_core._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    ".auditor": ("BATCHES", "SCOPES", "GNQAuditor", "GNQResult"),
    ".plan.batch": ("BatchDimensionError",),
    ".plan.coverage": ("Coverage", "UncoveredParametersError"),
    ".passes.distributed": ("DistributedGNQResult", "Scope", "Strategy"),
    ".kernels": ("Kernel", "UnsupportedModuleError", "kernel_for", "register"),
    ".math.conventions": ("IGNORE_INDEX", "LAM_ABSOLUTE", "LAM_MODES", "LAM_RELATIVE", "LOSS_CONVENTIONS",
                     "TOKEN_MEAN", "TOKEN_SUM", "check_lam_mode", "check_loss_convention"),
    ".math.losses": ("lm_token_mean_weights", "per_example_lm_loss"),
    ".math.reference": ("exact_gnq", "per_example_gradients"),
    ".selfcheck": ("run_selfcheck",),
    ".sketch.projection": ("SketchSpec", "Sketcher", "sketched_gnq"),
    ".math.solve": ("GNQNumericalError", "gnq_from_kernel"),
    ".passes.window": ("WindowBudgetError", "WindowResult"),
    ".passes.window_ddp": ("DistributedWindowResult",),
})
