"""Training-framework integrations: in-run GNQ inside a trainer you already use.

- ``gnq_core.integrations.hf``: ``GNQTrainer`` (a ``transformers.Trainer`` subclass), its
  settings ``GNQConfig`` and ``lm_collator``; needs ``accelerate``, as the Trainer does.
- ``gnq_core.integrations.trl``: ``GNQSFTTrainer`` (TRL's ``SFTTrainer``); needs ``trl``.

Names are imported on first use: importing this package imports neither transformers' Trainer
nor trl, peft or the dashboard.
"""

from gnq_core._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    ".hf": ("GNQConfig", "GNQTrainer", "lm_collator"),
    ".trl": ("GNQSFTTrainer",),
})
