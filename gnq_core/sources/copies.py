"""Copies of a text inside one dataset: exact duplicates and near-duplicates.

Why it matters: GNQ asks how much of a text's gradient its batch companions fail to explain.
Two copies of a record in one batch explain each other (GNQ ≈ 1), so duplication hides a text
from GNQ while making it *more* likely to be memorised (Kandpal et al. 2022; Carlini et al.
2022: extraction grows roughly log-linearly with the number of copies).  So every text carries
its copy count, and a post-hoc audit keeps copies in different batches (tokens.batch_partition).

Rule (a pure function of the texts, no tokenizer, no model):

* exact copies: equal after normalisation (Unicode NFKC, case-folded, runs of whitespace
  collapsed, leading/trailing whitespace removed);
* near copies: Jaccard similarity of their sets of word 3-shingles at least ``NEAR_THRESHOLD``
  (0.8, the threshold of Lee et al. 2022, "Deduplicating training data makes language models
  better").  MinHash LSH (datasketch, 128 permutations, seeded) proposes candidate pairs in
  about linear time; every candidate is then checked with the exact Jaccard similarity, so the
  result does not depend on MinHash's false positives.  Word shingles rather than tokenizer
  tokens keep the rule independent of the model.  At 0.8 a 20-word record that differs from
  another in one word (a different name or card number) is *not* a copy (J ≈ 0.71): records
  that share a template are distinct secrets, not copies.
* clusters: connected components of both relations; a text's ``copies`` is its cluster's size
  (1: unique) and ``cluster_id`` the smallest index in the cluster.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

import numpy as np
import pandas as pd

NEAR_THRESHOLD = 0.8
SHINGLE_WORDS = 3
NUM_PERM = 128
MINHASH_SEED = 1
LSH_MARGIN = 0.75  # index tuned for J = 0.6: a pair at J = 0.8 becomes a candidate with p = 0.986
COPY_COLUMNS = ["copies", "cluster_id"]

_WORD = re.compile(r"\w+", re.UNICODE)


def normalise(text: str) -> str:
    """The form in which two texts count as exact copies."""
    return " ".join(unicodedata.normalize("NFKC", str(text)).casefold().split())


def shingles(text: str, width: int = SHINGLE_WORDS) -> set[str]:
    """Word ``width``-grams of the normalised text (the whole text when it has fewer words)."""
    words = _WORD.findall(normalise(text))
    if len(words) <= width:
        return {" ".join(words)} if words else set()
    return {" ".join(words[i: i + width]) for i in range(len(words) - width + 1)}


def jaccard(a: set[str], b: set[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


class _Components:
    """Union-find over 0..n-1; each component is named by its smallest member."""

    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, i: int, j: int) -> None:
        a, b = self.find(i), self.find(j)
        if a != b:
            self.parent[max(a, b)] = min(a, b)


def find_copies(texts: Sequence[str], threshold: float = NEAR_THRESHOLD) -> pd.DataFrame:
    """Per text (in input order): ``copies`` (size of its cluster, 1 = unique) and ``cluster_id``.

    ``threshold`` in (0, 1]: the Jaccard similarity of word 3-shingles at which two texts are
    near copies (1.0: exact copies only).
    """
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"the near-copy threshold must lie in (0, 1], got {threshold}")
    n = len(texts)
    comps = _Components(n)
    first: dict[str, int] = {}
    for i, text in enumerate(texts):
        key = normalise(text)
        if key in first:
            comps.union(first[key], i)
        else:
            first[key] = i
    if threshold < 1.0:
        _join_near_copies(texts, sorted(first.values()), threshold, comps)
    roots = np.array([comps.find(i) for i in range(n)], dtype=np.int64)
    sizes = np.bincount(roots, minlength=n) if n else np.zeros(0, dtype=np.int64)
    return pd.DataFrame({"copies": sizes[roots].astype(int), "cluster_id": roots.astype(int)},
                        columns=COPY_COLUMNS)


def _join_near_copies(texts: Sequence[str], distinct: list[int], threshold: float,
                      comps: _Components) -> None:
    """Union the distinct texts whose shingle sets have Jaccard ≥ threshold (LSH candidates,
    verified exactly)."""
    from datasketch import MinHash, MinHashLSH

    sets = {i: shingles(texts[i]) for i in distinct}
    encoded = [[s.encode("utf-8") for s in sets[i]] for i in distinct]
    hashes = MinHash.bulk(encoded, num_perm=NUM_PERM, seed=MINHASH_SEED)
    # LSH tuned for a lower similarity than the rule's: a pair right at the threshold would be
    # missed about half the time by an index tuned for the threshold itself.
    lsh = MinHashLSH(threshold=threshold * LSH_MARGIN, num_perm=NUM_PERM)
    for i, h in zip(distinct, hashes, strict=True):
        for j in lsh.query(h):
            if jaccard(sets[i], sets[j]) >= threshold:
                comps.union(i, j)
        lsh.insert(i, h)
