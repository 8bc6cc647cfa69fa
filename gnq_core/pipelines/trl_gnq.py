"""TRL's ``SFTTrainer`` with in-run GNQ on every micro-batch: ``GNQSFTTrainer``.

    from gnq_core.pipelines.trl_gnq import GNQSFTTrainer
    from gnq_core.pipelines.hf_callback import GNQConfig

    # dataset: a datasets.Dataset with an integer "example_id" column beside TRL's own columns
    # ("text", or "prompt" + "completion": completion-only loss, TRL's default for them)
    trainer = GNQSFTTrainer(model=model, args=SFTConfig(...), train_dataset=dataset,
                            processing_class=tokenizer, gnq=GNQConfig(out="runs/sft-shards"))
    trainer.train()

TRL prepares the dataset as usual (tokenising, building ``labels`` with −100 on prompt tokens
when the loss is completion-only, truncating).  This subclass keeps ``example_id`` through that
preparation and through TRL's collator, and computes the loss itself from per-example losses:
Σ_j n_j ℓ_j / N, TRL's token-mean loss over the completion tokens (the same update), with ℓ_j
each text's mean NLL over its own completion tokens.  It needs no ``compute_loss_func`` (which
TRL deprecates).  TRL's per-batch metrics beyond the loss (token accuracy, entropy) are not
logged; GNQ's summaries are.

Packing (``packing=True``) and padding-free batches put several texts in one row and TRL keeps
only ``input_ids`` and ``labels`` of packed rows: which text a document was is gone, so GNQ per
text cannot be recorded.  Both are refused at setup in one line.  Gradient checkpointing (on by
default in ``SFTConfig``) is exact (engine/recompute.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from trl import SFTTrainer

from gnq_core.engine.compiled import check_no_compile_setting, check_not_compiled
from gnq_core.pipelines.hf_callback import EXAMPLE_ID, GNQCallback, GNQConfig, token_mean_objective

__all__ = ["GNQSFTTrainer", "with_example_ids"]


def with_example_ids(collate: Callable[[list[dict[str, Any]]], dict[str, Any]]
                     ) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    """TRL's collator, with each row's ``example_id`` passed on as a tensor."""

    def collate_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
        missing = [i for i, r in enumerate(rows) if EXAMPLE_ID not in r]
        if missing:
            raise ValueError(f"GNQSFTTrainer needs an '{EXAMPLE_ID}' column in the training dataset (row "
                             f"{missing[0]} of the batch has none)")
        ids = torch.tensor([int(r[EXAMPLE_ID]) for r in rows], dtype=torch.long)
        batch = collate([{k: v for k, v in r.items() if k != EXAMPLE_ID} for r in rows])
        batch[EXAMPLE_ID] = ids
        return batch

    return collate_rows


class GNQSFTTrainer(SFTTrainer):
    """``trl.SFTTrainer`` with in-run GNQ on every micro-batch (see the module doc)."""

    def __init__(self, *args: Any, gnq: GNQConfig, **kwargs: Any) -> None:
        if kwargs.get("compute_loss_func") is not None:
            raise ValueError("GNQSFTTrainer computes the loss from per-example losses itself; "
                             "compute_loss_func cannot be combined with it")
        config = kwargs.get("args")
        if getattr(config, "packing", False) or getattr(config, "padding_free", False):
            raise ValueError("GNQSFTTrainer: packing / padding_free put several texts in one row and TRL "
                             "keeps no text ids for them, so GNQ per text cannot be recorded; set "
                             "packing=False and padding_free=False")
        super().__init__(*args, **kwargs)
        plugin = getattr(getattr(self.accelerator, "state", None), "dynamo_plugin", None)
        backend = getattr(getattr(plugin, "backend", None), "value", None)
        check_no_compile_setting(bool(self.args.torch_compile), backend)
        check_not_compiled(self.model)
        self.data_collator = with_example_ids(self.data_collator)
        self.gnq = GNQCallback(gnq, self)
        self.gnq.trainer_name = "trl.SFTTrainer (GNQSFTTrainer)"
        self.add_callback(self.gnq)

    def _set_signature_columns_if_needed(self) -> None:
        super()._set_signature_columns_if_needed()
        if EXAMPLE_ID not in self._signature_columns:  # kept through RemoveColumnsCollator
            self._signature_columns.append(EXAMPLE_ID)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        ids = inputs.pop(EXAMPLE_ID, None)
        if not (model.training and torch.is_grad_enabled()):
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        self.gnq.before_forward(ids)
        labels = inputs["labels"]
        outputs = model(**{k: v for k, v in inputs.items() if k != "labels"}, use_cache=False)
        loss = token_mean_objective(self.gnq, outputs.logits, labels, num_items_in_batch)
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if "loss" in logs or "train_loss" in logs:
            logs = {**logs, **self.gnq.summaries()}
        super().log(logs, *args, **kwargs)

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.gnq.after_backward(self.state)
        return loss
