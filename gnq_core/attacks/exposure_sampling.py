"""A value's rank in its space estimated without bias, by sampling from the model itself.

rank(v) = 1 + #{x ≠ v in the space: p(x) ≥ p(v)}.  Drawing x from a proposal q that puts mass on
every value of the space, E_q[1{p(x) ≥ p(v), x ≠ v} / q(x)] is exactly that count, so the mean of
n such weights is an unbiased estimate (importance sampling), with its standard error from the
weights' spread.  The proposal is the model's own distribution over the tokens that can spell the
template at each position (prompt and text between kept), mixed with ``UNIFORM`` of the uniform
one over those tokens so that no value's q is vanishingly small: where p(x) ≥ p(v), 1/q(x) ≤
Z / p(v) is bounded, so the values that make the rank are the ones the proposal draws most.  A path
counts only when it is its string's canonical tokenisation (each value once, as the exact search
counts it) and the string is a value of the space (template and check digit kept).

The sample depends on the prompt, the text between and the format, never on the value: every value
measured after the same prompt (the null's never-trained values, a value's copies) shares it.
Measured against exhaustive enumeration in benchmarks/exposure_estimate.py (results in
benchmarks/results/exposure_estimate_*.json); the skew-normal tail it replaces overstated exposure
by a median +1.28 bits on SmolLM2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

UNIFORM = 0.1   # share of the proposal that is uniform over the fitting tokens (bounds every weight)


class NonFinite(ValueError):
    """A score is NaN or infinite: no rank can be read from it (also ``attacks.exposure.NonFinite``)."""


@dataclass(frozen=True)
class Draws:
    """n draws of the proposal after one prompt: each draw's log p (the model's log-likelihood of
    the path), log q, and the value it spells (None: not canonical, or not a value of the space)."""

    log_p: np.ndarray
    log_q: np.ndarray
    values: list[str | None]

    def rank(self, value: str, score: float) -> tuple[float, float]:
        """(estimated rank of ``value`` scoring ``score``, its standard error)."""
        hit = np.array([v is not None and v != value for v in self.values]) & (self.log_p >= score)
        w = np.where(hit, np.exp(np.minimum(-self.log_q, 700.0)), 0.0)
        n = len(w)
        return 1.0 + float(w.mean()), float(w.std(ddof=1) / math.sqrt(n)) if n > 1 else math.inf


def spellings(text: str, off: int, hidden: dict[int, str], strings: Sequence[str], true_ids: Sequence[int]
              ) -> tuple[list[list[tuple[int, int]]], torch.Tensor, list[torch.Tensor]]:
    """The tokens that can spell ``text`` (the text between, then from ``off`` a value of its space;
    ``hidden``: index -> the characters a free or check place may take, its kind's alphabet):
    (per character position, each fitting token's (id, characters); ``keep``, the token ids whose
    columns are kept, the tail's own included (and shared between searches); per position, its
    fitting tokens' columns in ``keep``)."""

    def fits(s: str, pos: int) -> bool:
        if not s or pos + len(s) > len(text):
            return False
        for k, c in enumerate(s):
            j = pos + k - off
            if not (c in hidden[j] if j in hidden else c == text[pos + k]):
                return False
        return True

    alphabet = set(text).union(*hidden.values())
    pool = [(i, s) for i, s in enumerate(strings) if s and set(s) <= alphabet]
    fitting = [[(i, len(s)) for i, s in pool if fits(s, pos)] for pos in range(len(text))]
    keep = torch.tensor(sorted({i for i, _ in pool} | set(true_ids)), dtype=torch.long)
    col = {int(t): j for j, t in enumerate(keep.tolist())}
    return fitting, keep, [torch.tensor([col[i] for i, _ in f], dtype=torch.long) for f in fitting]


def draw(scorer, tokenizer, space, between: str, n: int, seed: int, strings: Sequence[str]) -> Draws | None:
    """``n`` paths from the proposal (module docstring) after ``scorer``'s prompt; None when this
    tokenizer's tokens do not decode one by one to the tail's characters (a path's string is then
    unknown) or a position has no token that fits."""
    text = between + space.value
    true_ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if not true_ids or "".join(strings[i] for i in true_ids) != text:
        return None
    off = len(between)
    fitting, keep, options_at = spellings(text, off, space.hidden, strings, true_ids)
    if any(not f for f in fitting):
        return None
    gen = torch.Generator().manual_seed(int(seed) % (2 ** 63))
    paths: list[tuple[int, ...]] = [()] * n
    pos = [0] * n
    log_p, log_q = np.zeros(n), np.zeros(n)
    active = list(range(n))
    while active:
        rows = scorer.next_logprobs([paths[i] for i in active], keep)
        still = []
        for i, row in zip(active, rows, strict=True):
            lp = row[options_at[pos[i]]]
            if torch.isnan(lp).any() or not torch.isfinite(lp).any():
                raise NonFinite("a candidate's log-likelihood is not finite")
            model_q = torch.softmax(lp, dim=0)
            q = (1 - UNIFORM) * model_q + UNIFORM / len(lp)
            k = int(torch.multinomial(q, 1, generator=gen))
            tok, width = fitting[pos[i]][k]
            paths[i] = (*paths[i], tok)
            log_p[i] += float(lp[k])
            log_q[i] += math.log(float(q[k]))
            pos[i] += width
            if pos[i] < len(text):
                still.append(i)
        active = still
    spelled = ["".join(strings[t] for t in p) for p in paths]
    canon = tokenizer(spelled, add_special_tokens=False)["input_ids"]
    values = [s[off:] if list(c) == list(p) and space.allows(s[off:]) else None
              for s, c, p in zip(spelled, canon, paths, strict=True)]
    return Draws(log_p, log_q, values)


def estimate(draws: Draws, value: str, score: float, space_bits: float, found: int = 0,
             z: float = 1.645, beaten: int = 0, uniform: int = 0) -> tuple[float, float, str]:
    """(exposure, p-value at the rank's upper bound, how) of ``value`` scoring ``score`` from the
    proposal's ``draws``; ``found``: values an exact search already saw at least as likely (the
    rank is at least found + 1); ``beaten`` of ``uniform`` values drawn uniformly from the space
    at least as likely: the rank is at least the one-sided 95% Clopper–Pearson lower bound of that
    share times the space (where few draws of the model can be read as values, e.g. a tokenizer
    whose merges make most sampled paths non-canonical, the importance estimate is heavy-tailed
    and its typical value too small: the uniform sample keeps it from claiming a rank it refutes)."""
    from scipy.stats import beta

    rank, se = draws.rank(value, score)
    size = 2.0 ** space_bits
    floor = (1.0 + (size - 1.0) * float(beta.ppf(0.05, beaten, uniform - beaten + 1))
             if beaten and uniform else 1.0)
    rank = max(rank, found + 1.0, floor)
    rank = min(rank, size)
    upper = min(size, rank + z * se)
    usable = sum(v is not None for v in draws.values)
    how = (f"importance sampling: {len(draws.values)} values drawn from the model's own distribution over "
           f"the free characters ({usable} usable), rank ≈ {rank:,.1f} ± {se:,.1f} (standard error"
           + (f"; at least {floor:,.1f}: {beaten} of {uniform} uniform values beat it" if floor > 1 else "")
           + "); "
           f"p-value at its upper 95% bound, {upper:,.1f} of 2^{space_bits:.1f}")
    return float(max(0.0, space_bits - math.log2(rank))), float(min(1.0, upper / size)), how
