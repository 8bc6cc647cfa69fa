"""Texts -> token ids, one convention for training, auditing and the extraction attack.

Each example is its text's tokens (no special tokens added), truncated to ``max_length``.
Batches are right-padded; labels are the input ids with padding set to -100, so each
example's loss is its mean next-token NLL over its own tokens (losses.per_example_lm_loss).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from gnq_core.engine.math.conventions import IGNORE_INDEX
from gnq_core.sources.tokenizer_panics import panics_as_one_line


def encode_texts(tokenizer, texts: Sequence[str], max_length: int) -> list[list[int]]:
    """Token ids of each text, without special tokens, truncated to ``max_length``; a Rust panic of
    an untrusted tokenizer is one TokenizerFailure line naming its folder.

    Tokenisers read the whole text before truncating (a 2-million-character word took 46 s), so a
    text longer than ``char_bound`` is cut to it first.  The bound leaves twice the characters the
    first ``max_length + 1`` tokens can span; a cut text that still gives no more than
    ``max_length`` tokens (a tokenizer that drops characters) is tokenised whole, so the ids are
    those of the whole text, up to how the one word the cut falls in is merged when that word
    starts within the bound."""
    where = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
    texts = list(texts)
    bound = char_bound(tokenizer, max_length)
    long = [i for i, t in enumerate(texts) if len(t) > bound]
    if not long or getattr(tokenizer, "truncation_side", "right") != "right":  # left: keeps the end
        with panics_as_one_line(where, "the tokenizer failed on the texts"):
            return _encode(tokenizer, texts, max_length)
    cut = set(long)
    with panics_as_one_line(where, "the tokenizer failed on the texts"):
        ids = _encode(tokenizer, [t if i not in cut else "" for i, t in enumerate(texts)], max_length)
        over = _encode(tokenizer, [texts[i][:bound] for i in long], max_length + 1)
        whole = [i for i, o in zip(long, over, strict=True) if len(o) <= max_length]
        for i, o in zip(long, over, strict=True):
            ids[i] = o[:max_length]
        for i, again in zip(whole, _encode(tokenizer, [texts[i] for i in whole], max_length), strict=True):
            ids[i] = again
    return ids


def _encode(tokenizer, texts: list[str], max_length: int) -> list[list[int]]:
    if not texts:
        return []
    enc = tokenizer(texts, add_special_tokens=False, truncation=True, max_length=max_length)
    return [list(ids) for ids in enc["input_ids"]]


_LONGEST: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> longest entry


def char_bound(tokenizer, max_length: int) -> int:
    """The characters of a text read before tokenising it for ``max_length`` tokens: twice what
    ``max_length + 1`` tokens of the tokenizer's longest vocabulary entry span (an entry's
    characters are at least the text characters it stands for: byte-level and byte-fallback
    entries spell each byte with one character or more), and 64 more."""
    try:
        longest = _LONGEST[tokenizer]
    except (KeyError, TypeError):
        vocab = tokenizer.get_vocab()
        longest = max((len(token) for token in vocab), default=1)
        with contextlib.suppress(TypeError):
            _LONGEST[tokenizer] = longest
    return 2 * (max_length + 1) * max(longest, 1) + 64


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


def collate(ids: Sequence[Sequence[int]], example_ids: Sequence[int], pad: int,
            trained: Sequence[Sequence[bool]] | None = None) -> LMBatch:
    """Right-pad token lists into one batch.  ``trained``: per example, which token positions carry
    the loss (a chat fine-tune's assistant or completion tokens, sources/chat.py); the labels are
    −100 on the others, as the trainer's were."""
    width = max(1, max(len(x) for x in ids))
    input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, : len(x)] = torch.tensor(x, dtype=torch.long)
        mask[i, : len(x)] = 1
    labels = input_ids.masked_fill(mask == 0, IGNORE_INDEX)
    if trained is not None:
        for i, (x, m) in enumerate(zip(ids, trained, strict=True)):
            keep = torch.tensor(list(m[: len(x)]) + [False] * (width - min(len(m), len(x))), dtype=torch.bool)
            labels[i] = labels[i].masked_fill(~keep, IGNORE_INDEX)
    return LMBatch(list(example_ids), input_ids, mask, labels)


TOKEN_CHUNK = 4096  # texts tokenised per call when only their token counts are wanted


def token_counts(tokenizer, texts: Sequence[str], max_length: int, chunk: int | None = None) -> np.ndarray:
    """Tokens per text after truncation (int32), ``chunk`` (default ``TOKEN_CHUNK``) texts
    tokenised at a time, so the token ids of a whole dataset are never held at once."""
    chunk = chunk or TOKEN_CHUNK
    counts = np.empty(len(texts), dtype=np.int32)
    for start in range(0, len(texts), chunk):
        ids = encode_texts(tokenizer, texts[start: start + chunk], max_length)
        counts[start: start + len(ids)] = [len(x) for x in ids]
    return counts


@dataclass(frozen=True)
class Partition:
    """A batch partition as two numpy arrays (8 bytes per example, not a Python list per batch):
    batch k is ``order[bounds[k]:bounds[k + 1]]``."""

    order: np.ndarray  # example indices, batch after batch (int64)
    bounds: np.ndarray  # len(self) + 1 offsets into order

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def batch(self, k: int) -> list[int]:
        return self.order[self.bounds[k]: self.bounds[k + 1]].tolist()

    def size(self, k: int) -> int:
        return int(self.bounds[k + 1] - self.bounds[k])

    def lists(self) -> list[list[int]]:
        return [self.batch(k) for k in range(len(self))]


def stream_batches(tokenizer, texts: Sequence[str], partition: Partition, indices: Iterable[int],
                   max_length: int, trained: Callable[[int, int], Sequence[bool]] | None = None
                   ) -> Iterator[LMBatch]:
    """The batches ``indices`` of ``partition``, tokenised one batch at a time as they are consumed.
    ``trained(i, n)``: text i's trained-token mask over its first n tokens (None: every token)."""
    pad = pad_id(tokenizer)
    for k in indices:
        part = partition.batch(k)
        ids = encode_texts(tokenizer, [texts[i] for i in part], max_length)
        masks = None if trained is None else [trained(i, len(x)) for i, x in zip(part, ids, strict=True)]
        yield collate(ids, part, pad, masks)


def batch_partition(n_examples: int, batch_size: int, seed: int,
                    clusters: Sequence[int] | np.ndarray | None = None) -> list[list[int]]:
    """``seeded_partition(...)`` as a list of batches, each a list of example indices."""
    return seeded_partition(n_examples, batch_size, seed, clusters).lists()


def seeded_partition(n_examples: int, batch_size: int, seed: int,
              clusters: Sequence[int] | np.ndarray | None = None) -> Partition:
    """A seeded shuffle of 0..n-1 cut into batches; the same for every checkpoint of an audit.

    ``clusters`` (one id per example, e.g. ``copies.find_copies(texts)["cluster_id"]``): copies
    of a text explain each other's gradient, so no batch gets two members of one cluster
    whenever the data allow it (no cluster larger than the number of batches).  The batch sizes
    stay those of the plain partition (all ``batch_size``, the last one the remainder).  Without
    clusters, or when every cluster is a single example, the plain seeded shuffle is returned.
    """
    if batch_size < 1:
        raise ValueError("batch size must be at least 1")
    order = np.random.default_rng(seed).permutation(n_examples).astype(np.int64)
    bounds = np.append(np.arange(0, n_examples, batch_size, dtype=np.int64), n_examples)
    plain = Partition(order, bounds)
    if clusters is None:
        return plain
    if len(clusters) != n_examples:
        raise ValueError(f"{len(clusters)} cluster ids for {n_examples} examples")
    shuffled = np.asarray(clusters, dtype=np.int64)[order]  # each shuffled position's cluster
    _, first, inverse, counts = np.unique(shuffled, return_index=True, return_inverse=True,
                                          return_counts=True)
    if n_examples == 0 or counts.max() == 1:
        return plain
    return Partition(_deal_apart(order, counts[inverse], first[inverse], np.diff(bounds)), bounds)


def _deal_apart(order: np.ndarray, size: np.ndarray, first: np.ndarray, capacities: np.ndarray) -> np.ndarray:
    """Deal clusters, largest first, round-robin over the batches that still have room.

    ``size`` / ``first``: per shuffled position, its cluster's size and the position of the
    cluster's first member.  Clusters are dealt largest first (ties: the cluster met first in the
    shuffled order), a cluster's members in shuffled order, one after another, so they land in
    distinct batches whenever the cluster is no larger than the number of batches open when its
    dealing starts.  Batches fill evenly and close (when full) only in the last round, so this
    separates every cluster when no cluster is larger than the number of full-size batches; a
    cluster as large as the number of batches also gets one member per batch while the last,
    smaller batch has room.

    Round-robin over the open batches has a closed form: the k-th member dealt goes to batch
    k mod n_batches while every batch is open, i.e. for the first ``last * n_batches`` members
    (``last``: the last batch's capacity, which it reaches first), then round-robin over the
    other batches.  Returns the dealt example indices batch after batch, each batch in dealing order.
    """
    n, n_batches, last = len(order), len(capacities), int(capacities[-1])
    dealt = order[np.lexsort((np.arange(n), first, -size))]
    k = np.arange(n, dtype=np.int64)
    every = last * n_batches
    batch = np.where(k < every, k % n_batches, (k - every) % max(n_batches - 1, 1))
    return dealt[np.argsort(batch, kind="stable")]
