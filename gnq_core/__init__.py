"""GNQ Audit: exact per-example gradient uniqueness for PyTorch / Hugging Face models.

The library's public names (``pip install gnq-audit``; no dashboard, store or attacks needed):

- ``GNQAuditor``: in-run GNQ, one door for every batch (``batch="micro" | "step"``) and scope
  (``scope="rank" | "global"``); its results ``GNQResult`` (per micro-batch) and
  ``WindowResult`` (per optimizer step), sketched windows set by ``SketchSpec``;
- ``per_example_lm_loss`` and ``lm_token_mean_weights``: each text's own loss ℓ_j and the
  weights of the token-mean objective;
- ``exact_gnq``: the float64 reference the auditor is tested against;
- ``register`` (a kernel for a layer type of your own), the errors ``GNQError``,
  ``UnsupportedModuleError``, ``GNQNumericalError``, and ``one_line`` (any error as one line).

The Trainer integrations are ``gnq_core.integrations.hf`` (``GNQTrainer``, ``GNQConfig``,
``lm_collator``) and ``gnq_core.integrations.trl`` (``GNQSFTTrainer``).  Each layer has a facade
of its own (``gnq_core.engine``, ``.sources``, ``.results``, ``.pipelines``, ``.analysis``); the
results store (``gnq_core.results.Store``) and the dashboard need ``gnq-audit[dashboard]``.
Names are imported on first use, so ``import gnq_core`` does not import torch.
"""

import sys

from gnq_core import _moved
from gnq_core._lazy import lazy_exports

_moved.install()  # modules that moved stay importable by their old paths for a release

_ENTRY_MODULES = ("gnq_core.cli", "gnq_core.jobs.jobs")
if sys.argv[:1] == ["-m"] and any(m in sys.orig_argv for m in _ENTRY_MODULES):
    # ``python -m gnq_core.cli`` (or the dashboard's job process) is starting and Python imports this
    # package first: a Ctrl-C during the heavy imports that follow is one line, not a traceback.
    from gnq_core.common import interrupts

    interrupts.guard_startup()

__version__ = "0.1.0"

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "gnq_core.engine.auditor": ("GNQAuditor", "GNQResult"),
    "gnq_core.engine.kernels": ("UnsupportedModuleError", "register"),
    "gnq_core.engine.math.losses": ("lm_token_mean_weights", "per_example_lm_loss"),
    "gnq_core.engine.math.reference": ("exact_gnq",),
    "gnq_core.engine.sketch.projection": ("SketchSpec",),
    "gnq_core.engine.math.solve": ("GNQNumericalError",),
    "gnq_core.engine.passes.window": ("WindowResult",),
    "gnq_core.errors": ("GNQError", "one_line"),
})
