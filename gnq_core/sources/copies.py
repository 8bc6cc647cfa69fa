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

import hashlib
import re
import unicodedata
from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd

NEAR_THRESHOLD = 0.8
SHINGLE_WORDS = 3
NUM_PERM = 128
MINHASH_SEED = 1
LSH_MARGIN = 0.75  # index tuned for J = 0.6: a pair at J = 0.8 becomes a candidate with p = 0.986
COPY_COLUMNS = ["copies", "cluster_id"]
LSH_CHUNK = 4096  # texts whose MinHash signatures are held at once

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
    # Texts without a word ("!!!", "…", "—") share nothing to compare: not near copies of each
    # other (they were all labelled one "repeated N×" cluster); equal ones are still exact copies.
    if not a or not b:
        return 0.0
    return len(a & b) / len(a | b)


class _Components:
    """Union-find over 0..n-1 in one numpy array (8 bytes a text); each component is named by its
    smallest member."""

    def __init__(self, n: int) -> None:
        self.parent = np.arange(n, dtype=np.int64)

    def find(self, i: int) -> int:
        parent = self.parent
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = int(parent[i])
        return i

    def union(self, i: int, j: int) -> None:
        a, b = self.find(i), self.find(j)
        if a != b:
            self.parent[max(a, b)] = min(a, b)

    def roots(self) -> np.ndarray:
        """Every member's root, by pointer jumping (a parent is never larger than its child)."""
        roots = self.parent.copy()
        while True:
            up = roots[roots]
            if np.array_equal(up, roots):
                return roots
            roots = up


def find_copies(texts: Sequence[str], threshold: float = NEAR_THRESHOLD) -> pd.DataFrame:
    """Per text (in input order): ``copies`` (size of its cluster, 1 = unique) and ``cluster_id``.

    ``threshold`` in (0, 1]: the Jaccard similarity of word 3-shingles at which two texts are
    near copies (1.0: exact copies only).  Memory: a few numpy arrays of a text's size (its
    digest, its parent in the union-find, its LSH band keys), never a Python object per text.
    """
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"the near-copy threshold must lie in (0, 1], got {threshold}")
    n = len(texts)
    comps = _Components(n)
    distinct = _join_exact_copies(texts, comps)
    if threshold < 1.0:
        _join_near_copies(texts, distinct, threshold, comps)
    roots = comps.roots()
    sizes = np.bincount(roots, minlength=n) if n else np.zeros(0, dtype=np.int64)
    return pd.DataFrame({"copies": sizes[roots].astype(int), "cluster_id": roots.astype(int)},
                        columns=COPY_COLUMNS)


def _digest(text: str) -> int:
    normal = normalise(text).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(normal, digest_size=8).digest(), "little")


def _groups(keys: np.ndarray) -> Iterator[np.ndarray]:
    """The positions of each run of two or more equal keys, each in increasing position."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(keys) else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], len(keys)]
    for start, end in zip(starts[ends - starts > 1], ends[ends - starts > 1], strict=True):
        yield order[start:end]


def _join_exact_copies(texts: Sequence[str], comps: _Components) -> np.ndarray:
    """Union the exact copies; returns the first text of each distinct normalised form, in order.
    Texts are grouped by a 64-bit digest of their normalised form, then compared exactly within
    a group (a digest collision never joins two different texts)."""
    digests = np.fromiter((_digest(t) for t in texts), dtype=np.uint64, count=len(texts))
    first_of_form = np.ones(len(texts), dtype=bool)
    for members in _groups(digests):
        first: dict[str, int] = {}
        for i in members.tolist():
            key = normalise(texts[i])
            if key in first:
                comps.union(first[key], i)
                first_of_form[i] = False
            else:
                first[key] = i
    return np.flatnonzero(first_of_form)


def _join_near_copies(texts: Sequence[str], distinct: np.ndarray, threshold: float,
                      comps: _Components) -> None:
    """Union the distinct texts whose shingle sets have Jaccard ≥ threshold (LSH candidates,
    verified exactly).

    The candidates are those of datasketch's ``MinHashLSH`` (the same MinHash signatures and
    bands): texts that agree on every value of at least one band.  Only a 64-bit key per band
    is kept (``LSH_CHUNK`` texts' signatures at a time), and texts with equal keys are found by
    sorting; a key collision only adds a candidate, and every candidate is verified exactly.
    A pair already in one component is not compared again (it cannot change the components).
    """
    from datasketch import MinHash, MinHashLSH

    # LSH tuned for a lower similarity than the rule's: a pair right at the threshold would be
    # missed about half the time by an index tuned for the threshold itself.
    bands = MinHashLSH(threshold=threshold * LSH_MARGIN, num_perm=NUM_PERM).hashranges
    keys = np.empty((len(distinct), len(bands)), dtype=np.uint64)
    for start in range(0, len(distinct), LSH_CHUNK):
        chunk = distinct[start: start + LSH_CHUNK].tolist()
        encoded = [[s.encode("utf-8") for s in shingles(texts[i])] for i in chunk]
        signatures = np.stack([h.hashvalues for h in MinHash.bulk(encoded, num_perm=NUM_PERM,
                                                                  seed=MINHASH_SEED)]).astype(np.uint64)
        for b, (lo, hi) in enumerate(bands):
            keys[start: start + len(chunk), b] = _band_key(signatures[:, lo:hi])
    for b in range(len(bands)):
        for members in _groups(keys[:, b]):
            _verify(texts, distinct[members].tolist(), threshold, comps)


def _band_key(values: np.ndarray) -> np.ndarray:
    """One 64-bit key per row of a band's MinHash values (a multiply-xorshift mix)."""
    key = np.zeros(len(values), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in values.T:
            key = (key ^ column) * np.uint64(0x9E3779B97F4A7C15)
            key ^= key >> np.uint64(29)
    return key


def _verify(texts: Sequence[str], members: list[int], threshold: float, comps: _Components) -> None:
    """Union every pair of ``members`` whose exact Jaccard similarity reaches the threshold."""
    sets = [shingles(texts[i]) for i in members]
    for a in range(len(members)):
        for b in range(a):
            if comps.find(members[a]) != comps.find(members[b]) and jaccard(sets[a], sets[b]) >= threshold:
                comps.union(members[a], members[b])
