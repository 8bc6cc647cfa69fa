"""Texts -> token ids, one convention for training, auditing and the extraction attack.

Each example is its text's tokens (no special tokens added), truncated to ``max_length``.
Batches are right-padded; labels are the input ids with padding set to -100, so each
example's loss is its mean next-token NLL over its own tokens (losses.per_example_lm_loss).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from gnq_core.engine.losses import IGNORE_INDEX


def encode_texts(tokenizer, texts: Sequence[str], max_length: int) -> list[list[int]]:
    """Token ids of each text, without special tokens, truncated to ``max_length``."""
    enc = tokenizer(list(texts), add_special_tokens=False, truncation=True, max_length=max_length)
    return [list(ids) for ids in enc["input_ids"]]


def pad_id(tokenizer) -> int:
    """The id used for padding: the tokenizer's pad token, else its EOS token."""
    pid = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pid is None:
        raise ValueError("the tokenizer has neither a pad nor an EOS token to pad batches with")
    return int(pid)


@dataclass
class LMBatch:
    example_ids: list[int]
    input_ids: torch.Tensor  # [B, T] right-padded
    attention_mask: torch.Tensor  # [B, T]
    labels: torch.Tensor  # [B, T], -100 on padding

    def to(self, device: torch.device) -> LMBatch:
        return LMBatch(self.example_ids, self.input_ids.to(device), self.attention_mask.to(device),
                       self.labels.to(device))


def collate(ids: Sequence[Sequence[int]], example_ids: Sequence[int], pad: int) -> LMBatch:
    """Right-pad token lists into one batch."""
    width = max(1, max(len(x) for x in ids))
    input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, : len(x)] = torch.tensor(x, dtype=torch.long)
        mask[i, : len(x)] = 1
    labels = input_ids.masked_fill(mask == 0, IGNORE_INDEX)
    return LMBatch(list(example_ids), input_ids, mask, labels)


def partition_order(n_examples: int, seed: int) -> np.ndarray:
    """The seeded shuffle of 0..n-1 that batch_partition cuts into batches (8 bytes per example,
    instead of a Python list per batch)."""
    return np.random.default_rng(seed).permutation(n_examples)


def batch_partition(n_examples: int, batch_size: int, seed: int) -> list[list[int]]:
    """A seeded shuffle of 0..n-1 cut into batches; the same for every checkpoint of an audit."""
    if batch_size < 1:
        raise ValueError("batch size must be at least 1")
    order = partition_order(n_examples, seed).tolist()
    return [order[i: i + batch_size] for i in range(0, n_examples, batch_size)]


def stream_batches(tokenizer, texts: Sequence[str], order: np.ndarray, batch_size: int,
                   max_length: int) -> Iterator[LMBatch]:
    """The batches of batch_partition, tokenised one batch at a time as they are consumed, so the
    token ids of a whole dataset are never held at once."""
    if batch_size < 1:
        raise ValueError("batch size must be at least 1")
    pad = pad_id(tokenizer)
    for start in range(0, len(order), batch_size):
        part = order[start: start + batch_size].tolist()
        yield collate(encode_texts(tokenizer, [texts[i] for i in part], max_length), part, pad)


def token_counts(tokenizer, texts: Sequence[str], max_length: int, chunk: int = 4096) -> np.ndarray:
    """Tokens per text after truncation (int32), tokenised ``chunk`` texts at a time."""
    counts = np.empty(len(texts), dtype=np.int32)
    for start in range(0, len(texts), chunk):
        ids = encode_texts(tokenizer, texts[start: start + chunk], max_length)
        counts[start: start + len(ids)] = [len(x) for x in ids]
    return counts
