"""GNQ Audit: exact per-example gradient uniqueness for PyTorch / Hugging Face models.

The user API: the auditor (``GNQAuditor``; ``DistributedGNQAuditor`` under torch.distributed),
the Trainer integration (``GNQTrainer``, ``GNQConfig``, ``lm_collator``), the store (``Store``)
and the engine's exact reference.  Each layer has a facade of its own (``gnq_core.engine``,
``.sources``, ``.results``, ``.pipelines``, ``.analysis``, ``.studies``); names are imported on
first use, so ``import gnq_core`` does not import torch.
"""

import sys

from gnq_core._lazy import lazy_exports

_ENTRY_MODULES = ("gnq_core.cli", "gnq_core.jobs.jobs")
if sys.argv[:1] == ["-m"] and any(m in sys.orig_argv for m in _ENTRY_MODULES):
    # ``python -m gnq_core.cli`` (or the dashboard's job process) is starting and Python imports this
    # package first: a Ctrl-C during the heavy imports that follow is one line, not a traceback.
    from gnq_core import interrupts

    interrupts.guard_startup()

__version__ = "0.1.0"

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "gnq_core.engine.auditor": ("GNQAuditor", "GNQResult"),
    "gnq_core.engine.batch": ("BatchDimensionError",),
    "gnq_core.engine.coverage": ("Coverage", "UncoveredParametersError"),
    "gnq_core.engine.distributed": ("DistributedGNQAuditor",),
    "gnq_core.engine.kernels": ("UnsupportedModuleError", "register"),
    "gnq_core.engine.losses": ("lm_token_mean_weights", "per_example_lm_loss"),
    "gnq_core.engine.reference": ("exact_gnq",),
    "gnq_core.engine.sketch": ("SketchSpec",),
    "gnq_core.engine.solve": ("GNQNumericalError", "gnq_from_kernel"),
    "gnq_core.engine.window": ("WindowAuditor",),
    "gnq_core.engine.window_ddp": ("DistributedWindowAuditor",),
    "gnq_core.errors": ("GNQError", "one_line"),
    "gnq_core.pipelines.hf_callback": ("GNQConfig", "GNQTrainer", "lm_collator"),
    "gnq_core.results.store": ("Store",),
})
