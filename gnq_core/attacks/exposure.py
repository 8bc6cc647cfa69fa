"""Exposure of a secret over its own randomness (Carlini et al. 2019, "The secret sharer").

A value's *space* is every value its format allows, as its kind's catalog entry
(gnq_core/catalog/kinds.py) defines it: its free characters (those neither the run's format,
``secret_attack.format_places``, nor the kind's own prefix fixes) take any character of the
kind's alphabet (digits; a key's base62; an IBAN's letter a capital), every other character
stays as it is ("+44 20 7946 ####"), and the characters a check derives (a valid card number's
Luhn digit, an IBAN's two check digits) follow from the others.  The
model scores a value by the log-likelihood of its tokens (the canonical tokenisation of the
text between the prompt and the value, then the value) after the same prompt; rank = 1 + the
number of other values of the space at least as likely, exposure = log2 |space| − log2 rank.

* **Exact rank** (``search_rank``): a best-first search over token prefixes whose characters fit
  the template.  A prefix's log-likelihood only falls as tokens are added, so a prefix already
  less likely than the whole true value cannot lead to a value that outranks it and is pruned;
  every value that does outrank it is reached along its canonical tokenisation (each of its
  prefixes is at least as likely as it), and a complete path counts only if it *is* its string's
  canonical tokenisation (each value once).  This holds for any tokenizer whose tokens decode
  one by one to their characters (checked on the true value; otherwise, enumeration when the
  space fits the budget).  A memorised value is found after few nodes.
* **Order of work**: the search runs first with ``PROBE_NODES`` (a memorised value is ranked in
  about two nodes per digit); if it does not finish, ``n`` random values of the space are
  scored, and the search resumes with the whole node budget only when the nodes it would
  expand, forecast from those values' own prefixes (``expected_nodes``), fit the budget: a
  search that would run out (a non-memorised value, or any value whose prefixes are wide open
  at six free digits) ends estimated anyway, after up to a minute of a CPU core.
* **Estimate** otherwise: importance sampling from the model's own distribution over the free
  characters (``exposure_sampling``: an unbiased estimate of the rank, with its standard error;
  the p-value read at its upper 95% bound), capped by what the search already found.  Labelled
  ``estimated``, with how.  Only for a tokenizer whose tokens do not decode one by one (no path
  can be read as a value) the older skew-normal tail fitted to the random values' scores stands
  in, and says so: it overstated exposure by a median +1.28 bits against exact ranks.

Scores are computed after one forward of the prompt whose KV cache every candidate shares.
Non-finite scores give no exposure (missing), never the ceiling.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import heapq
import itertools
import math
import random
import string
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from gnq_core.attacks import exposure_sampling
from gnq_core.attacks.decode import cache_argument, returned_cache
from gnq_core.attacks.defaults import DEFAULT_EXPOSURE_NODES as DEFAULT_SEARCH_NODES
from gnq_core.attacks.defaults import MIN_SECRET_CANDIDATES as MIN_CANDIDATES
from gnq_core.attacks.exposure_sampling import NonFinite
from gnq_core.attacks.generation import last_logprobs
from gnq_core.catalog import DIGITS, SPACE
from gnq_core.catalog import kind as catalog_kind

EXACT, ESTIMATED = "exact", "estimated"
MIN_FREE_DIGITS = 3  # fewer free digits (a space under 1,000 values): no exposure is measured
PROBE_NODES = 64  # the search tried first, before any random value is scored


@dataclass(frozen=True)
class ValueSpace:
    """The values a secret's format allows (module docstring): ``value`` with its ``free``
    indices redrawn, each from its alphabet (``alphabets``, one per free index; empty: digits), and
    the characters its kind's check derives (``check``: a card's Luhn digit, an IBAN's two check
    digits) recomputed by the catalog entry of ``kind``."""

    value: str
    free: tuple[int, ...]
    check: tuple[int, ...] = ()
    alphabets: tuple[str, ...] = ()
    kind: str = ""

    def alphabet(self, k: int) -> str:
        """The characters free index number ``k`` may take."""
        return self.alphabets[k] if self.alphabets else DIGITS

    @property
    def size(self) -> int:
        return math.prod(len(self.alphabet(k)) for k in range(len(self.free)))

    @property
    def bits(self) -> float:
        return sum(math.log2(len(self.alphabet(k))) for k in range(len(self.free)))

    @property
    def hidden(self) -> dict[int, str]:
        """Index -> the characters it may take, for every free or derived character."""
        out = {i: self.alphabet(k) for k, i in enumerate(self.free)}
        for i in self.check:
            out[i] = DIGITS
        return out

    @property
    def template(self) -> str:
        """The value with its free characters (and check digits) as '#': "+44 20 7946 ####"."""
        hidden = self.hidden
        return "".join("#" if i in hidden else c for i, c in enumerate(self.value))

    def fill(self, chars: Sequence[str]) -> str:
        out = list(self.value)
        for i, d in zip(self.free, chars, strict=True):
            out[i] = d
        filled = "".join(out)
        return catalog_kind(self.kind).check.fill(filled) if self.check else filled

    def random(self, rng: random.Random) -> str:
        return self.fill([rng.choice(self.alphabet(k)) for k in range(len(self.free))])

    def allows(self, candidate: str) -> bool:
        """``candidate`` is a value of this space (template kept, check digits valid)."""
        if len(candidate) != len(self.value):
            return False
        hidden = self.hidden
        for i, (c, v) in enumerate(zip(candidate, self.value, strict=True)):
            if (c in hidden[i] if i in hidden else c == v) is False:
                return False
        return not self.check or catalog_kind(self.kind).check.valid(candidate)


_SEPARATORS = " ().+-/"


def value_space(value: str, kind: str, fixed: set[int]) -> ValueSpace | None:
    """The space of ``value`` as its kind's catalog entry defines it, ``fixed`` = the indices
    among its letters and digits that the run's format explains; None when its kind has no
    candidate space (catalog: exposure not SPACE), a digits-only kind's value holds other
    characters than digits and separators, or fewer than ``MIN_FREE_DIGITS`` characters are free
    (too few values to rank among).  A free character takes any character of its kind's alphabet
    (a key's: base62), or of its own class where the kind names none (an IBAN's digit a digit, its
    letter a capital); the vendor prefix or country code the format fixes stays."""
    entry = catalog_kind(kind)
    if not value or entry.exposure != SPACE:
        return None
    if entry.digits_only and any(not (c.isdigit() or c in _SEPARATORS) for c in value):
        return None
    alnum = [i for i, c in enumerate(value) if c.isalnum()]
    check = entry.check.places(value) if entry.check is not None else ()
    prefix = entry.fixed_prefix(value)
    free = tuple(i for j, i in enumerate(alnum)
                 if j not in fixed and j >= prefix and i not in check
                 and (entry.alphabet is None or value[i] in entry.alphabet))
    if len(free) < MIN_FREE_DIGITS:
        return None
    alphabets = tuple(entry.alphabet or _class_of(value[i]) for i in free)
    return ValueSpace(value, free, tuple(check), () if set(alphabets) == {DIGITS} else alphabets, kind)


def _class_of(c: str) -> str:
    return DIGITS if c.isdigit() else string.ascii_uppercase if c.isupper() else string.ascii_lowercase


def value_seed(seed: int, *parts: str) -> int:
    """A seed from the run's seed and the value itself (copies of a value draw the same values)."""
    digest = hashlib.sha256("\x1f".join([str(seed), *parts]).encode()).digest()
    return int.from_bytes(digest[:8], "big")


class PromptScorer:
    """Log-likelihoods of token continuations after one prompt, the prompt's KV cache computed
    once and shared by every batch of candidates."""

    def __init__(self, model, prompt: Sequence[int], batch_size: int, device=None):
        self.model, self.batch_size = model, max(1, int(batch_size))
        self.device = device if device is not None else next(model.parameters()).device
        ids = torch.tensor([list(prompt)], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True)
        self.cache = returned_cache(out)  # the model's Cache object
        self.cache_name = cache_argument(model)  # `cache` on transformers >= 5.24, else `past_key_values`
        self.context = ids.shape[1]
        self.root = torch.log_softmax(out.logits[0, -1].double(), dim=-1)
        # next-token rows already computed, per kept column set: every value searched after this
        # prompt (its null values, the copies' one value) walks the same top of the tree
        self._memo: dict[tuple[int, ...], dict[tuple[int, ...], torch.Tensor]] = {}
        # random values of a format and their scores, drawn once per (text between, format, seed):
        # a value's copies and its format's never-trained values share one sample (``_sample``)
        self.samples: dict[tuple, Sample] = {}
        # the proposal's draws (exposure_sampling), once per (text between, format, size, seed) likewise
        self.draws: dict[tuple, exposure_sampling.Draws | None] = {}
        self._scored: dict[tuple[int, ...], np.ndarray] = {}  # path -> its cumulative log-likelihoods

    def _forward(self, paths: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-softmax over every position, lengths) for right-padded ``paths`` (non-empty)."""
        width = max(len(p) for p in paths)
        ids = torch.zeros((len(paths), width), dtype=torch.long)
        mask = torch.zeros((len(paths), self.context + width), dtype=torch.long)
        mask[:, : self.context] = 1
        for r, p in enumerate(paths):
            ids[r, : len(p)] = torch.tensor(list(p), dtype=torch.long)
            mask[r, self.context: self.context + len(p)] = 1
        cache = copy.deepcopy(self.cache)  # a forward extends the cache it is given
        cache.batch_repeat_interleave(len(paths))
        with torch.inference_mode():
            out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                             use_cache=True, **{self.cache_name: cache})
        return torch.log_softmax(out.logits.double(), dim=-1), torch.tensor([len(p) for p in paths])

    def next_logprobs(self, paths: Sequence[Sequence[int]], keep: torch.Tensor | None = None) -> torch.Tensor:
        """log p(next token | prompt, path) for every path, (len(paths), vocab); with ``keep`` (token
        ids) only those columns, (len(paths), len(keep)), each path computed once per scorer."""
        if keep is not None:
            return self._kept_logprobs(paths, keep)
        rows: list[torch.Tensor] = []
        nonempty = [p for p in paths if len(p)]
        got = iter(())
        if nonempty:
            parts = []
            for s in range(0, len(nonempty), self.batch_size):
                logp, lengths = self._forward(nonempty[s: s + self.batch_size])
                parts.append(logp[torch.arange(len(lengths)), lengths - 1])
            got = iter(torch.cat(parts))
        for p in paths:
            rows.append(next(got) if len(p) else self.root)
        return torch.stack(rows).cpu()

    def _kept_logprobs(self, paths: Sequence[Sequence[int]], keep: torch.Tensor) -> torch.Tensor:
        memo = self._memo.setdefault(tuple(keep.tolist()), {})
        todo = list(dict.fromkeys(tuple(p) for p in paths if len(p) and tuple(p) not in memo))
        for s in range(0, len(todo), self.batch_size):
            chunk = todo[s: s + self.batch_size]
            rows = last_logprobs(self, chunk)[:, keep.to(self.root.device)].cpu()
            memo.update(zip(chunk, rows, strict=True))
        root = self.root[keep.to(self.root.device)].cpu()
        return torch.stack([memo[tuple(p)] if len(p) else root for p in paths])

    def scores(self, paths: Sequence[Sequence[int]]) -> np.ndarray:
        """Total log-likelihood of each (non-empty) path after the prompt."""
        return np.array([float(c[-1]) for c in self.cumulative(paths)], dtype=float)

    def cumulative(self, paths: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Each (non-empty) path's log-likelihood after its first 1, 2, ... tokens, each path
        computed once per scorer (a value's search and its sample both need its score)."""
        todo = list(dict.fromkeys(tuple(p) for p in paths if tuple(p) not in self._scored))
        for s in range(0, len(todo), self.batch_size):
            chunk = todo[s: s + self.batch_size]
            logp, lengths = self._forward(chunk)
            for r, p in enumerate(chunk):
                ids = torch.tensor(list(p), dtype=torch.long, device=logp.device)
                steps = torch.arange(len(p) - 1, device=logp.device)
                each = torch.cat([self.root[ids[:1]], logp[r, steps, ids[1:]]])
                self._scored[p] = each.cumsum(0).cpu().numpy()
        return [self._scored[tuple(p)] for p in paths]


def token_strings(tokenizer) -> list[str]:
    """Every token's characters, decoded one by one (cached on the tokenizer object)."""
    cached = getattr(tokenizer, "_gnq_token_strings", None)
    if cached is None:
        cached = [tokenizer.decode([i], clean_up_tokenization_spaces=False) for i in range(len(tokenizer))]
        with contextlib.suppress(AttributeError):  # a tokenizer that takes no attributes: decoded again
            tokenizer._gnq_token_strings = cached
    return cached


@dataclass(frozen=True)
class Ranked:
    """What the exact search or the enumeration found: ``rank`` None when the node budget ran
    out (``found`` values at least as likely had been seen by then)."""

    rank: int | None
    nodes: int
    found: int
    score: float


def _tail(between: str, value: str, tokenizer) -> list[int]:
    return list(tokenizer(between + value, add_special_tokens=False)["input_ids"])


def score_values(scorer: PromptScorer, tokenizer, between: str, values: Sequence[str]) -> np.ndarray:
    """Each value's log-likelihood after the scorer's prompt and ``between``, in batches (and kept:
    the exposure of any of them reads its score from there)."""
    return np.array([float(c[-1]) for c in scorer.cumulative([_tail(between, v, tokenizer) for v in values])])


def search_rank(scorer: PromptScorer, tokenizer, space: ValueSpace, between: str,
                budget: int) -> Ranked | None:
    """The true value's exact rank in its space by the pruned best-first search (module
    docstring); None when this tokenizer's tokens do not decode one by one to the tail's
    characters (the search cannot tell which values a path spells)."""
    text = between + space.value
    true_ids = _tail(between, space.value, tokenizer)
    strings = token_strings(tokenizer)
    if not true_ids or "".join(strings[i] for i in true_ids) != text:
        return None
    off = len(between)
    # only the columns of tokens that can spell the tail are kept (and shared between searches)
    fitting, keep, options_at = exposure_sampling.spellings(text, off, space.hidden, strings, true_ids)
    # the true value's score from one forward of its whole tail (not one per prefix: L²/2 tokens); the
    # search's prefixes come from other batchings, equal to it up to float rounding
    score = float(scorer.cumulative([true_ids])[0][-1])
    if not math.isfinite(score):
        raise NonFinite("the value's log-likelihood is not finite")
    nodes = len(true_ids)  # the value's own prefixes, scored
    heap: list[tuple[float, int, tuple[int, ...], int]] = [(-0.0, 0, (), 0)]
    tie = 1
    found = 0
    while heap:
        batch = [heapq.heappop(heap) for _ in range(min(len(heap), scorer.batch_size))]
        if nodes + len(batch) > budget:
            return Ranked(None, nodes, found, score)
        nodes += len(batch)
        nxt = scorer.next_logprobs([b[2] for b in batch], keep)
        if torch.isnan(nxt).any():
            raise NonFinite("a candidate's log-likelihood is NaN")
        leaves: list[tuple[tuple[int, ...], str]] = []
        for (neg, _, path, pos), row in zip(batch, nxt, strict=True):
            options = fitting[pos]
            if not options:
                continue
            child = (-neg) + row[options_at[pos]]
            for (tok, n), sc in zip(options, child.tolist(), strict=True):
                if not sc >= score:  # pruned: every value below this prefix is less likely
                    continue
                if pos + n == len(text):
                    leaves.append(((*path, tok), "".join(strings[t] for t in (*path, tok))))
                else:
                    heapq.heappush(heap, (-sc, tie, (*path, tok), pos + n))
                    tie += 1
        if leaves:
            canon = tokenizer([s for _, s in leaves], add_special_tokens=False)["input_ids"]
            for (path, s), c in zip(leaves, canon, strict=True):
                value = s[off:]
                if value != space.value and list(c) == list(path) and space.allows(value):
                    found += 1
    return Ranked(found + 1, nodes, found, score)


def enumerate_rank(scorer: PromptScorer, tokenizer, space: ValueSpace, between: str) -> Ranked:
    """The exact rank by scoring every value of the space (its full continuation each)."""
    values = [space.fill(d) for d in itertools.product(*(space.alphabet(k) for k in range(len(space.free))))]
    tails = [_tail(between, v, tokenizer) for v in values]
    scores = scorer.scores(tails)
    true = float(scores[values.index(space.value)])
    if not np.isfinite(scores).all():
        raise NonFinite("a log-likelihood is not finite")
    found = int((scores >= true).sum()) - 1
    return Ranked(found + 1, len(values), found, true)


@dataclass(frozen=True)
class Exposure:
    """One value's exposure under one model."""

    bits: float | None   # None: not measurable (non-finite scores)
    method: str | None   # EXACT or ESTIMATED
    rank: int | None     # exact rank in the space (None: estimated)
    nodes: int           # candidate prefixes / values the model scored
    candidates: int | None  # random values behind an estimate
    fit: str | None      # how the estimate was made
    p_value: float | None = None  # an estimate's p-value (upper bound); None: 2^−bits (exact)


def exposure(model, tokenizer, prompt: Sequence[int], between: str, space: ValueSpace, *,
             budget: int = DEFAULT_SEARCH_NODES, n_candidates: int = 128, seed: int = 0,
             batch_size: int = 32, device=None, scorer: PromptScorer | None = None) -> Exposure:
    """``space.value``'s exposure after ``prompt`` (module docstring): exact where the search (or
    enumerating a space within ``budget``) finishes, else estimated from ``n_candidates``.
    ``scorer``: this model's scorer of this prompt, shared by every value probed after it
    (attacks.exposure.Scorers), else one made for this value."""
    try:
        scorer = scorer if scorer is not None else PromptScorer(model, prompt, batch_size, device)
        # a memorised value is ranked within a few nodes: no random values needed
        probe = search_rank(scorer, tokenizer, space, between, min(budget, PROBE_NODES))
        if probe is not None and probe.rank is not None:
            return Exposure(space.bits - math.log2(probe.rank), EXACT, probe.rank, probe.nodes, None, None)
        true, others, sample = _sample(scorer, tokenizer, space, between, n_candidates, seed)
        ranked = probe
        fits = expected_nodes(true, sample, space, len(between)) <= budget
        if probe is not None and budget > PROBE_NODES and fits:
            ranked = search_rank(scorer, tokenizer, space, between, budget)
        if ranked is None and space.size <= budget:
            ranked = enumerate_rank(scorer, tokenizer, space, between)
        if ranked is not None and ranked.rank is not None:
            return Exposure(space.bits - math.log2(ranked.rank), EXACT, ranked.rank, ranked.nodes, None, None)
        found = ranked.found if ranked is not None else 0
        n = len(others) + 1
        key = (between, space.template, space.check, n, seed)
        if key not in scorer.draws:
            scorer.draws[key] = exposure_sampling.draw(scorer, tokenizer, space, between, n, seed,
                                                       token_strings(tokenizer))
        draws, p_value = scorer.draws[key], None
        if draws is not None:
            bits, p_value, fit = exposure_sampling.estimate(draws, space.value, true, space.bits, found,
                                                            beaten=int((others >= true).sum()),
                                                            uniform=len(others))
        else:
            bits, fit = estimate_bits(true, others, space.bits)
            bits = min(bits, space.bits - math.log2(found + 1))
            fit += " (this tokenizer's tokens do not decode one by one: no draw from the model can be read)"
        if ranked is probe and probe is not None and budget > PROBE_NODES:
            fit += (f"; the exact search stopped after {probe.nodes} nodes: the sample's prefixes forecast "
                    f"more nodes than its {budget}")
        elif ranked is not None:  # the search already saw ``found`` values at least as likely
            fit += f"; the exact search ran out of its {budget} nodes"
            if ranked.found:
                fit += f" after {ranked.found} values at least as likely (the floor they put on the rank)"
        drawn = len(draws.values) if draws is not None else 0
        return Exposure(max(0.0, bits), ESTIMATED, None, (ranked.nodes if ranked else 0) + n + drawn, n, fit,
                        p_value)
    except NonFinite:
        return Exposure(None, None, None, 0, None, None)


@dataclass(frozen=True)
class Sample:
    """Random values of a format after one prompt (``_sample``), each scored in full and after each
    of its tokens: ``depths[i]`` the characters of the tail its first 1, 2, ... tokens cover,
    ``cumulative[i]`` their log-likelihood there."""

    values: list[str]
    scores: np.ndarray
    depths: list[np.ndarray]
    cumulative: list[np.ndarray]


def expected_nodes(true: float, sample: Sample, space: ValueSpace, offset: int) -> float:
    """How many nodes the exact search would expand for ``space.value`` scoring ``true``, forecast
    from the random values' own prefixes (the search is not started when this is beyond its
    budget: it would end estimated anyway, after minutes on a long value).

    A value whose canonical tokenisation has a prefix at least as likely as ``true`` ending at
    character ``c`` (of the text between prompt and value, then the value: ``offset`` characters
    before the value) puts that prefix among the expanded nodes, and the values sharing one
    prefix are those sharing its first ``f(c)`` free digits: the nodes ending at ``c`` number
    about 10^f(c) × the share of the space with such a prefix.  The share is the sample's: of the
    ``m`` values with a token boundary at ``c``, (k + ½)/(m + 1) have such a prefix (the Jeffreys
    posterior mean, so a depth where no sampled prefix reached ``true`` still counts the share
    the sample cannot rule out: 10^6 × ½/129 ≈ 3,900 nodes at six free digits and 128 values)."""
    free = np.array(space.free) + offset
    n = len(sample.values)
    boundaries: dict[int, int] = {}
    hits: dict[int, int] = {}
    for value, depths, cumulative in zip(sample.values, sample.depths, sample.cumulative, strict=True):
        if value == space.value:  # its own prefixes say nothing of the others
            n -= 1
            continue
        for c, above in zip(depths.tolist(), (cumulative >= true).tolist(), strict=True):
            boundaries[c] = boundaries.get(c, 0) + 1
            hits[c] = hits.get(c, 0) + int(above)
    # the number of prefixes that fix the free characters before c: the product of their alphabets
    widths = np.array([float(len(space.alphabet(k))) for k in range(len(space.free))])
    return float(sum(float(np.prod(widths[free < c])) * (m / max(n, 1)) * (hits[c] + 0.5) / (m + 1)
                     for c, m in boundaries.items()))


def _sample(scorer: PromptScorer, tokenizer, space: ValueSpace, between: str, n_candidates: int,
            seed: int) -> tuple[float, np.ndarray, Sample]:
    """(the value's score, those of ``n_candidates`` − 1 distinct random values of its space, the
    whole sample with each value's prefixes).

    The random values depend on ``seed`` and the format alone, not on the value: every value of a
    format probed after the same prompt (the null's never-trained values, a value's copies) is
    compared with one sample, scored once per prompt.  Each is still a uniform sample of the other
    values: the value itself is left out where it was drawn, else the last one drawn."""
    n = int(min(max(n_candidates, MIN_CANDIDATES), space.size - 1))
    key = (between, space.template, space.check, n, seed)
    if key not in scorer.samples:
        rng = random.Random(seed)
        drawn: dict[str, None] = {}  # distinct, in the order drawn
        while len(drawn) < n:
            drawn[space.random(rng)] = None
        values = list(drawn)
        tails = [_tail(between, v, tokenizer) for v in values]
        cumulative = scorer.cumulative(tails)
        strings = token_strings(tokenizer)
        depths = [np.cumsum([len(strings[t]) for t in tail]) for tail in tails]
        # internal prefixes only: a whole value is a leaf, never expanded
        scorer.samples[key] = Sample(values, np.array([float(c[-1]) for c in cumulative]),
                                     [d[:-1] for d in depths], [c[:-1] for c in cumulative])
    sample = scorer.samples[key]
    values, scores = sample.values, sample.scores
    others = np.delete(scores, values.index(space.value) if space.value in values else n - 1)
    true = score_values(scorer, tokenizer, between, [space.value])
    if not (np.isfinite(others).all() and np.isfinite(true).all()):
        raise NonFinite("a log-likelihood is not finite")
    return float(true[0]), others, sample


def estimate_bits(true: float, others: np.ndarray, ceiling: float) -> tuple[float, str]:
    """(exposure, how) of a value scoring ``true`` among random values of its space scoring
    ``others``: their sampled share when some are at least as likely, else −log2 of the share a
    skew-normal fitted to them puts at or above ``true`` (Carlini et al. §4.3); at most ``ceiling``
    (log2 of the space's size)."""
    from scipy import stats

    others = np.asarray(others, dtype=float)
    beaten = int((others >= true).sum())
    if beaten or len(others) < 3 or float(others.std()) == 0.0:  # nothing to extrapolate from
        share = (beaten + 1) / (len(others) + 1)
        how = f"sampled share: {beaten + 1} of {len(others) + 1} random values at least as likely"
    else:
        a, loc, scale = skewnorm_moments(others)
        share = float(stats.skewnorm.sf(true, a, loc, scale)) if scale > 0 else 0.0
        how = (f"skew-normal (shape {a:.3g}, loc {loc:.4g}, scale {scale:.4g}) fitted by its moments to "
               f"{len(others)} random values' log-likelihoods")
    bits = -math.log2(share) if share > 0 and math.isfinite(share) else ceiling
    return float(min(max(bits, 0.0), ceiling)), how


def skewnorm_moments(x: np.ndarray) -> tuple[float, float, float]:
    """(shape, loc, scale) of the skew-normal with ``x``'s mean, variance and skewness (the method
    of moments: closed form, milliseconds, where a maximum-likelihood fit takes ~0.2 s a value;
    the skewness is clipped to the family's range, |γ| < 0.995)."""
    from scipy import stats

    x = np.asarray(x, dtype=float)
    if len(x) < 3 or float(x.std()) == 0.0:
        return 0.0, float(x.mean()) if len(x) else 0.0, 0.0
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    gamma = float(np.clip(stats.skew(x), -0.99, 0.99))
    g = abs(gamma) ** (2 / 3)
    delta = math.copysign(math.sqrt(math.pi / 2 * g / (g + ((4 - math.pi) / 2) ** (2 / 3))), gamma)
    scale = sd / math.sqrt(1 - 2 * delta ** 2 / math.pi)
    return delta / math.sqrt(1 - delta ** 2), mean - scale * delta * math.sqrt(2 / math.pi), scale


class Scorers:
    """One ``PromptScorer`` per (model, prompt), made on first use and kept: every value
    probed after the same prompt by the same model shares its cache and computed rows."""

    def __init__(self, batch_size: int, device: torch.device | None = None):
        self.batch_size, self.device = batch_size, device
        self._made: dict[tuple[int, tuple[int, ...]], PromptScorer] = {}

    def __call__(self, model: torch.nn.Module, prompt: Sequence[int]) -> PromptScorer:
        key = (id(model), tuple(int(t) for t in prompt))
        if key not in self._made:
            self._made[key] = PromptScorer(model, key[1], self.batch_size, self.device)
        return self._made[key]
