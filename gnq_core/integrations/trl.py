"""TRL's ``SFTTrainer`` with in-run GNQ on every micro-batch: ``GNQSFTTrainer``.

    from gnq_core.integrations import GNQConfig, GNQSFTTrainer

    # dataset: a datasets.Dataset with an integer "example_id" column beside TRL's own columns
    # ("text", or "prompt" + "completion": completion-only loss, TRL's default for them)
    trainer = GNQSFTTrainer(model=model, args=SFTConfig(...), train_dataset=dataset,
                            processing_class=tokenizer, gnq=GNQConfig(out="runs/sft-shards"))
    trainer.train()

TRL prepares the dataset as usual (tokenising, building ``labels`` with −100 on prompt tokens
when the loss is completion-only, truncating).  This subclass keeps ``example_id`` through that
preparation and through TRL's collator, and computes the loss itself from per-example losses:
Σ_j n_j ℓ_j / N, TRL's token-mean loss over the completion tokens (the same update), with ℓ_j
each text's mean NLL over its own completion tokens (label-smoothed as TRL's, with
``label_smoothing_factor``; ``loss_type="dft"`` is refused in one line).  It needs no
``compute_loss_func`` (which TRL deprecates).  TRL's per-batch metrics beyond the loss (token
accuracy, entropy) are not logged; GNQ's summaries are.

Packing (``packing=True``, TRL's default ``packing_strategy="bfd"``): each text's example id
goes into the packed rows as a per-token column, packed by TRL's own ``pack_dataset`` beside the
tokens, and each micro-batch of packed rows is unpacked into its documents (the rows' document
boundaries, ``seq_lengths``), one row each, right-padded: GNQ is per document (per text), exact.
The loss is the packed one — the token mean over the documents' targets, no target across a
document boundary — with each document attending to itself only, as padding-free packing with
document-aware attention (FlashAttention's varlen path) computes it.  Strategies that split a
text over rows ("bfd_split", "wrapped") and padding-free batches without packing are refused at
setup in one line.  Gradient checkpointing (on by default in ``SFTConfig``) is exact
(engine/passes/recompute.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import torch
from trl import SFTTrainer, pack_dataset

from gnq_core.integrations.hf import (
    EXAMPLE_ID,
    GNQCallback,
    GNQConfig,
    GNQTrainerSteps,
    checked_examples,
    example_id,
    token_mean_objective,
)
from gnq_core.sources.tokens import collate as right_pad

TOKEN_IDS = "gnq_example_ids"  # a packed row's example id per token

__all__ = ["GNQSFTTrainer", "with_example_ids"]


def documents(rows: list[dict[str, Any]]) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """The documents of packed rows (tokens, labels, example id each), split at the rows'
    ``seq_lengths``; each document's ids must be one text's."""
    tokens, labels, ids = [], [], []
    for row in rows:
        start = 0
        for n in row["seq_lengths"]:
            owner = set(row[TOKEN_IDS][start:start + n])
            if len(owner) != 1:
                raise ValueError(f"GNQSFTTrainer: a packed document holds tokens of texts {sorted(owner)}")
            tokens.append(list(row["input_ids"][start:start + n]))
            labels.append(list(row["labels"][start:start + n]))
            ids.append(int(owner.pop()))
            start += n
    return tokens, labels, ids


def unpacked_collator(pad: int) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    """Packed rows -> one right-padded row per document: input_ids, attention_mask, labels (TRL's,
    −100 on prompt tokens and padding) and example_id."""

    def collate_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
        tokens, labels, ids = documents(rows)
        batch = right_pad(tokens, ids, pad)
        target = torch.full_like(batch.labels, -100)
        for j, lab in enumerate(labels):
            target[j, : len(lab)] = torch.tensor(lab, dtype=target.dtype)
        return {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "labels": target,
                EXAMPLE_ID: torch.tensor(ids, dtype=torch.long)}

    return collate_rows


class _SFTCallback(GNQCallback):
    """The run's examples table from TRL's prepared dataset, packed or not; conversations as the
    post-hoc audit stores them (the rendered text, its turns and trained tokens: sources/chat.py)."""

    chat: dict[int, Any] | None = None  # example id -> its Rendered conversation

    def _examples_frame(self) -> pd.DataFrame:
        frame = self._plain_frame()
        if self.chat:
            frame["text"] = [self.chat[int(e)].text if int(e) in self.chat else t
                             for e, t in zip(frame["example_id"], frame["text"], strict=True)]
            frame["turns"] = [self.chat[int(e)].layout.to_json() if int(e) in self.chat else None
                              for e in frame["example_id"]]
        return frame

    def _plain_frame(self) -> pd.DataFrame:
        ds, c = self.trainer.train_dataset, self.config
        if TOKEN_IDS not in ds.column_names:
            return super()._examples_frame()
        seen: dict[int, int] = {}  # example id -> its tokens
        for row in ds:
            tokens, _, ids = documents([row])
            seen |= {eid: len(t) for eid, t in zip(ids, tokens, strict=True)}
        texts = [c.texts[e] if c.texts is not None else "" for e in seen]
        groups = [c.groups[e] if c.groups is not None else None for e in seen]
        return pd.DataFrame({"example_id": list(seen), "text": texts, "grp": groups,
                             "n_tokens": list(seen.values())})


def rendered_conversations(dataset: Any, tokenizer: Any, args: Any, completion_only: bool | None
                           ) -> dict[int, Any] | None:
    """A conversational dataset's rows rendered as TRL trains them (sources/chat.py: the same
    tokens, the trained ones marked), by example id, for the store's examples table; None for
    text data."""
    from gnq_core.sources.chat import detect_format, example_of, render_example, training_template

    if dataset is None or not hasattr(dataset, "column_names") or EXAMPLE_ID not in dataset.column_names:
        return None
    fmt = detect_format(dataset.column_names)
    if fmt == "text" or (fmt == "prompt-completion" and isinstance(dataset[0]["prompt"], str)):
        return None  # plain texts: the row's text is what the store keeps
    train_on = ("assistant" if getattr(args, "assistant_only_loss", False)
                else "completion" if fmt == "prompt-completion" and completion_only is not False else "all")
    template = training_template(tokenizer, train_on, "the training dataset")
    return {int(row[EXAMPLE_ID]): render_example(tokenizer, example_of(row, fmt, "the training dataset", i),
                                                 train_on, chat_template=template)
            for i, row in enumerate(dataset)}


def with_example_ids(collate: Callable[[list[dict[str, Any]]], dict[str, Any]]
                     ) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    """TRL's collator, with each row's ``example_id`` passed on as a tensor."""

    def collate_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
        missing = [i for i, r in enumerate(rows) if EXAMPLE_ID not in r]
        if missing:
            raise ValueError(f"GNQSFTTrainer needs an '{EXAMPLE_ID}' column in the training dataset (row "
                             f"{missing[0]} of the batch has none)")
        ids = torch.tensor([example_id(r[EXAMPLE_ID], "GNQSFTTrainer") for r in rows], dtype=torch.long)
        batch = collate([{k: v for k, v in r.items() if k != EXAMPLE_ID} for r in rows])
        batch[EXAMPLE_ID] = ids
        return batch

    return collate_rows


class GNQSFTTrainer(GNQTrainerSteps, SFTTrainer):
    """``trl.SFTTrainer`` with in-run GNQ on every micro-batch (see the module doc)."""

    kept_columns = (EXAMPLE_ID, TOKEN_IDS)

    def __init__(self, *args: Any, gnq: GNQConfig, **kwargs: Any) -> None:
        self._refuse_compute_loss_func(kwargs)
        config = kwargs.get("args")
        packing = bool(getattr(config, "packing", False))
        if packing and getattr(config, "packing_strategy", "bfd") != "bfd":
            raise ValueError(f"GNQSFTTrainer: packing_strategy={config.packing_strategy!r} splits a text "
                             "over rows, so no row holds one text's gradient; use packing_strategy='bfd' "
                             "(the default)")
        if getattr(config, "loss_type", "nll") != "nll":
            raise ValueError(f"GNQSFTTrainer: loss_type={config.loss_type!r} weights each token by its own "
                             "detached probability, a loss GNQ's per-example losses do not form; use "
                             "loss_type='nll' (the default)")
        if getattr(config, "padding_free", False) and not packing:
            raise ValueError("GNQSFTTrainer: padding_free without packing concatenates a batch's texts "
                             "with no text ids; use packing=True (packing_strategy='bfd') or "
                             "padding_free=False")
        super().__init__(*args, **kwargs)
        if packing:  # one row per document, right-padded, with its text's id
            self.data_collator = unpacked_collator(self.processing_class.pad_token_id)
        else:
            self.data_collator = with_example_ids(self.data_collator)
        callback = _SFTCallback(gnq, self)
        callback.trainer_name = "trl.SFTTrainer (GNQSFTTrainer)"
        given = kwargs.get("train_dataset", args[2] if len(args) > 2 else None)  # as the user gave it
        callback.chat = rendered_conversations(given, self.processing_class, self.args,
                                               self.completion_only_loss)
        self._start_gnq(callback)

    def _prepare_dataset(self, dataset, processing_class, args, packing, formatting_func, dataset_name):
        """TRL's preparation; when packing, the texts' ids ride along as a per-token column through
        TRL's own ``pack_dataset``."""
        prepared = super()._prepare_dataset(dataset, processing_class, args, False, formatting_func,
                                            dataset_name)
        if not packing:
            return prepared
        if EXAMPLE_ID not in prepared.column_names:
            raise ValueError(f"GNQSFTTrainer needs an '{EXAMPLE_ID}' column in the {dataset_name} dataset")
        checked_examples(pd.DataFrame({"example_id": [example_id(v, "GNQSFTTrainer")
                                                      for v in prepared[EXAMPLE_ID]]}), "GNQSFTTrainer")
        prepared = prepared.map(lambda row: {TOKEN_IDS: [int(row[EXAMPLE_ID])] * len(row["input_ids"])})
        prepared = prepared.select_columns(["input_ids", "labels", TOKEN_IDS])
        return pack_dataset(prepared, args.max_length, "bfd")

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        ids = inputs.pop(EXAMPLE_ID, None)
        if not (model.training and torch.is_grad_enabled()):
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        self.gnq.before_forward(ids)
        labels = inputs["labels"]
        outputs = model(**{k: v for k, v in inputs.items() if k != "labels"}, use_cache=False)
        loss = token_mean_objective(self.gnq, outputs.logits, labels, num_items_in_batch,
                                    label_smoothing=self.args.label_smoothing_factor)  # TRL's LabelSmoother
        return (loss, outputs) if return_outputs else loss

