"""The importance-sampling exposure estimate (attacks/exposure_sampling.py) against exact ranks:
every value of a 4-free-digit space (10^4) scored in a few large batches, so each value's exact
rank is known, and the estimate from 128 draws of the model's own distribution compared with it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_exposure import _prompt, _tokenizer

from gnq_core.attacks import exposure_sampling
from gnq_core.attacks.exposure import PromptScorer, ValueSpace, token_strings
from gnq_core.sources.models import build_model

SPACE = ValueSpace("0000", (0, 1, 2, 3))


def exact_scores(model, tok, prompt: list[int]) -> np.ndarray:
    """Every value's log-likelihood after ``prompt`` and a space, from whole sequences (no cache)."""
    values = [SPACE.fill(f"{k:04d}") for k in range(SPACE.size)]
    tails = [tok(" " + v, add_special_tokens=False)["input_ids"] for v in values]
    out = np.empty(len(values))
    for s in range(0, len(values), 2048):
        chunk = tails[s: s + 2048]
        width = max(map(len, chunk))
        ids = torch.tensor([prompt + t + [0] * (width - len(t)) for t in chunk])
        with torch.inference_mode():
            logp = torch.log_softmax(model(input_ids=ids).logits.double(), dim=-1)
        for r, t in enumerate(chunk):
            at = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(t))
            out[s + r] = float(logp[r, at, torch.tensor(t)].sum())
    return out


@pytest.fixture(scope="module")
def scored():
    """(model, tokenizer, prompt, every value's exact log-likelihood), made once for the module."""
    tok = _tokenizer()
    model = build_model("tiny", len(tok), 64, seed=5).eval()
    prompt = _prompt(tok, "Anna Berg")
    return model, tok, prompt, exact_scores(model, tok, prompt)


def test_the_estimate_is_within_half_a_bit_of_the_exact_rank(scored):
    model, tok, prompt, scores = scored
    exact = np.array([int((scores >= s).sum()) for s in scores])  # 1 + the others at least as likely
    scorer = PromptScorer(model, prompt, 64)
    draws = exposure_sampling.draw(scorer, tok, SPACE, " ", 128, seed=1, strings=token_strings(tok))
    assert draws is not None and sum(v is not None for v in draws.values) > 64
    rng = np.random.default_rng(0)
    picked = [*rng.choice(SPACE.size, 40, replace=False), *np.argsort(-scores)[:10]]  # and the tail
    errors = []
    for i in picked:
        value = SPACE.fill(f"{i:04d}")
        bits, p, how = exposure_sampling.estimate(draws, value, float(scores[i]), SPACE.bits)
        errors.append(bits - (SPACE.bits - math.log2(exact[i])))
        assert 2.0 ** -bits <= p <= 1.0 and "importance sampling" in how  # p at the rank's upper bound
    errors = np.abs(errors)
    assert np.median(errors) <= 0.5 and (errors > 2).mean() <= 0.1, np.round(errors, 2)


def test_the_rank_estimate_is_unbiased(scored):
    """Averaged over independent draws, the estimated rank of a mid-ranked value is its exact rank
    (within three standard errors of that average)."""
    model, tok, prompt, scores = scored
    i = int(np.argsort(-scores)[300])
    value, exact = SPACE.fill(f"{i:04d}"), int((scores >= scores[i]).sum())
    scorer = PromptScorer(model, prompt, 64)
    ranks = [exposure_sampling.draw(scorer, tok, SPACE, " ", 64, seed=s, strings=token_strings(tok))
             .rank(value, float(scores[i]))[0] for s in range(2, 10)]
    mean, se = float(np.mean(ranks)), float(np.std(ranks, ddof=1) / math.sqrt(len(ranks)))
    assert abs(mean - exact) <= 3 * se + 1, (mean, se, exact)
