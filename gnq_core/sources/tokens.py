"""Texts -> token ids, one convention for training, auditing and the extraction attack.

Each example is its text's tokens (no special tokens added), truncated to ``max_length``.
Batches are right-padded; labels are the input ids with padding set to -100, so each
example's loss is its mean next-token NLL over its own tokens (losses.per_example_lm_loss).
"""

from __future__ import annotations

from collections.abc import Sequence
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


def batch_partition(n_examples: int, batch_size: int, seed: int,
                    clusters: Sequence[int] | None = None) -> list[list[int]]:
    """A seeded shuffle of 0..n-1 cut into batches; the same for every checkpoint of an audit.

    ``clusters`` (one id per example, e.g. ``copies.find_copies(texts)["cluster_id"]``): copies
    of a text explain each other's gradient, so no batch gets two members of one cluster
    whenever the data allow it (no cluster larger than the number of batches).  The batch sizes
    stay those of the plain partition (all ``batch_size``, the last one the remainder).  Without
    clusters, or when every cluster is a single example, the plain seeded shuffle is returned.
    """
    if batch_size < 1:
        raise ValueError("batch size must be at least 1")
    rng = np.random.default_rng(seed)
    order = rng.permutation(n_examples).tolist()
    plain = [order[i: i + batch_size] for i in range(0, n_examples, batch_size)]
    if clusters is None:
        return plain
    if len(clusters) != n_examples:
        raise ValueError(f"{len(clusters)} cluster ids for {n_examples} examples")
    members: dict[int, list[int]] = {}
    for i in order:  # members in shuffled order, so the dealing below stays seeded-random
        members.setdefault(int(clusters[i]), []).append(i)
    if all(len(m) == 1 for m in members.values()):
        return plain
    return _deal_apart(members, [len(b) for b in plain])


def _deal_apart(members: dict[int, list[int]], capacities: list[int]) -> list[list[int]]:
    """Deal clusters, largest first, round-robin over the batches that still have room.

    A cluster's members are dealt one after another, so they land in distinct batches whenever
    the cluster is no larger than the number of batches open when its dealing starts.  Batches
    fill evenly and close (when full) only in the last round, so this separates every cluster
    when no cluster is larger than the number of full-size batches; a cluster as large as the
    number of batches also gets one member per batch while the last, smaller batch has room.
    """
    batches: list[list[int]] = [[] for _ in capacities]
    open_batches = list(range(len(capacities)))
    at = 0  # index into open_batches of the batch that gets the next member
    for cluster in sorted(members.values(), key=len, reverse=True):  # stable: ties keep shuffled order
        for i in cluster:
            b = open_batches[at]
            batches[b].append(i)
            if len(batches[b]) == capacities[b]:
                open_batches.pop(at)  # the next open batch slides into this index
            else:
                at += 1
            if open_batches:
                at %= len(open_batches)
    return batches
