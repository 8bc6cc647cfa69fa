"""Exposure of a value that has no uniform candidate space (an e-mail address, a name, a street
address, a date of birth), relative to a reference model.

A name's candidates are not equally likely: "John Smith" is likelier than "Xavier Quaintance"
under any language model, so a rank by the audited model's likelihood alone calls a common name
"exposed" for being common.  What training on the value adds is the *likelihood ratio*
audited / reference: the value's log-likelihood after its own prompt under the audited model
minus that under the reference model (``log_ratio``, in nats).

* **The values the reference would write**: ``n`` continuations of the prompt drawn from the
  reference model itself (ancestral sampling at temperature 1, exactly as many tokens as the
  value's own tokenisation spans, seeded by the run's seed and the value), each scored by both
  models the same way as the value.
* **The share** of the reference's values whose ratio is at least the value's: the Monte Carlo
  share (1 + k) / (1 + n), k of the n at least as high.  Under the null (the value is one more
  value the reference would write, and the audited model did not train on it) the value and the
  samples are exchangeable, so that share is a p-value.  It cannot go below 1 / (n + 1); the
  true share is also at most e^−ratio whatever n (Markov's inequality: the reference's expected
  audited/reference ratio is the audited model's total probability over the same token strings,
  at most 1), which is what a memorised value's ratio gives.  The exposure is −log2 of the
  smaller of the two; its p-value, two valid bounds combined, is twice that (Bonferroni).
* **Labelled estimated**, with how, and no space size (``exposure_space_bits`` None): the share is
  of the reference's distribution, not of a countable set of values.
* **The null per kind, as for digits** (attacks/secret_exposure.py): never-trained values of the
  kind — surrogates of the run's values (sources/surrogates.py: an e-mail's mailbox redrawn with
  its domain kept, a name's letters redrawn in their case; never a value of the data) — scored the
  same way after the same prompts.  A fine-tune that learned the *kind* (e-mails follow "write to")
  raises the ratio of every value of it above what the reference writes; such values are not the
  value's doing, so "exposed" also needs the value's ratio to beat theirs (the likelihood-ratio
  test of attacks/exposure_fdr.py), and their exposures are the run's null for the kind.

Without a reference model there is nothing to be relative to: such values get no exposure (the
page says why).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from gnq_core.attacks.exposure import ESTIMATED, Exposure, PromptScorer
from gnq_core.attacks.exposure_sampling import NonFinite

MIN_VALUE_CHARS = 3  # a shorter value (an initial) has no exposure to speak of


@dataclass(frozen=True)
class ReferenceDraws:
    """Token strings the reference model wrote after one prompt, and the log-likelihood ratio
    audited − reference of each (nats)."""

    paths: list[tuple[int, ...]]
    log_ratios: np.ndarray


def draw_reference(reference_scorer: PromptScorer, audited_scorer: PromptScorer, n_tokens: int, n: int,
                   seed: int) -> ReferenceDraws:
    """``n`` continuations of ``n_tokens`` tokens sampled from the reference model after its
    scorer's prompt (batched; one seeded generator, so the same seed gives the same draws), each
    scored by both scorers as a value is (``PromptScorer.cumulative``)."""
    gen = torch.Generator().manual_seed(int(seed) % (2 ** 63))
    paths: list[tuple[int, ...]] = [()] * n
    for _ in range(n_tokens):
        rows = reference_scorer.next_logprobs(paths)
        if not torch.isfinite(rows).any(dim=1).all() or torch.isnan(rows).any():
            raise NonFinite("the reference model's next-token log-probabilities are not finite")
        picks = torch.multinomial(torch.softmax(rows, dim=1), 1, generator=gen)[:, 0].tolist()
        paths = [(*p, int(t)) for p, t in zip(paths, picks, strict=True)]
    return ReferenceDraws(paths, _log_ratios(audited_scorer, reference_scorer, paths))


def _log_ratios(audited: PromptScorer, reference: PromptScorer, paths: Sequence[Sequence[int]]) -> np.ndarray:
    ratios = (np.array([float(c[-1]) for c in audited.cumulative(paths)])
              - np.array([float(c[-1]) for c in reference.cumulative(paths)]))
    if np.isnan(ratios).any():
        raise NonFinite("a log-likelihood ratio is NaN")
    return ratios


def value_path(tokenizer, between: str, value: str) -> tuple[int, ...]:
    """The value's tokens after the prompt: the canonical tokenisation of the text between prompt
    and value, then the value (as ``attacks.exposure`` scores it)."""
    return tuple(tokenizer(between + value, add_special_tokens=False)["input_ids"])


def relative_bits(ratio: float, draws: ReferenceDraws) -> tuple[float, float, int]:
    """(exposure in bits, Monte Carlo share, k) of a value whose log ratio is ``ratio`` against
    ``draws`` (module docstring): −log2 of the smaller of (1 + k) / (1 + n) and e^−ratio (in bits,
    so a ratio of thousands of nats does not underflow)."""
    k = int((draws.log_ratios >= ratio).sum())
    mc = (1 + k) / (1 + len(draws.paths))
    return max(0.0, -math.log2(mc), ratio / math.log(2)), mc, k


def relative_exposure(ratio: float, draws: ReferenceDraws) -> Exposure:
    """The exposure of a value with log ratio ``ratio`` against the reference's ``draws``."""
    if not math.isfinite(ratio):
        return Exposure(None, None, None, 0, None, None)
    bits, mc, k = relative_bits(ratio, draws)
    n = len(draws.paths)
    bound = "e^−ratio, Markov's bound" if 2.0 ** -bits < mc else f"{1 + k} of {1 + n}"
    fit = (f"relative to the reference model: log-likelihood ratio audited/reference {ratio:.2f} nats; "
           f"{k} of {n} values drawn from the reference model have a ratio at least as high; share "
           f"{2.0 ** -bits:.3g} ({bound}); p-value twice that (the smaller of two bounds)")
    return Exposure(bits, ESTIMATED, None, n, n, fit, p_value=min(1.0, 2.0 * 2.0 ** -bits))


@dataclass(frozen=True)
class Relative:
    """One value's relative exposure (``relative_exposure``) and its log ratio (nats)."""

    exposure: Exposure
    log_ratio: float | None


def measure_kind(model, reference, tokenizer, members: Sequence, prompts: Sequence[Sequence[int]], scorers,
                 n: int, never: Sequence[Sequence[str]], seed_of: Callable[[int], int]
                 ) -> tuple[list[Relative], list[tuple[int, str, Relative]]]:
    """The relative exposures of one kind's distinct values (``members``: occurrences with
    ``value`` and ``between``, each after its prompt in ``prompts``, against ``n`` draws of the
    reference seeded by ``seed_of(i)``) and of never-trained values of the kind (``never[i]``:
    those measured after member i's prompt, against the same draws): (per member, [(member index,
    never-trained value, its exposure)])."""
    out: list[Relative] = []
    null: list[tuple[int, str, Relative]] = []
    for i, (o, prompt) in enumerate(zip(members, prompts, strict=True)):
        audited, ref = scorers(model, prompt), scorers(reference, prompt)
        path = value_path(tokenizer, o.between, o.value)
        others = [value_path(tokenizer, o.between, v) for v in never[i]]
        try:
            draws = draw_reference(ref, audited, len(path), n, seed_of(i))
            ratios = _log_ratios(audited, ref, [path, *others]).tolist()
        except NonFinite:
            out.append(Relative(Exposure(None, None, None, 0, None, None), None))
            continue
        out.append(Relative(relative_exposure(ratios[0], draws), ratios[0]))
        null += [(i, v, Relative(relative_exposure(r, draws), r))
                 for v, r in zip(never[i], ratios[1:], strict=True)]
    return out, null
