"""Probabilistic (n, p)-discoverable extraction (Hayes et al. 2024, "Measuring memorization in
language models via probabilistic extraction").

Greedy decoding asks one yes/no question.  A sampler (temperature T, top-k) emits a text's
suffix after its prefix with probability q = Π_t q(x_t | prefix, x_<t), where q(·|·) is the
model's next-token distribution at temperature T truncated to its k most likely tokens and
renormalised; q comes from the token probabilities of one teacher-forced forward pass (no
sampling needed).  The text is (n, p)-discoverable when n independent samples emit the suffix at
least once with probability ≥ p: 1 − (1 − q)^n ≥ p.  ``suffix_logprob`` stores log q per text
(−inf: a suffix token falls outside the top k, so the sampler can never emit it); any (n, p)
follows from it (``discoverable``).  With k = 1 this is greedy extraction: log q = 0 exactly
when greedy decoding reproduces the suffix.

Token convention as ``extraction``: the text's tokens without special tokens; the prefix is
``tokens[:p]``, the suffix exactly ``tokens[p:p+s]``; a shorter text gets NaN (not attackable).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from gnq_core.attacks.forward import forward_batches

TOP_K, TEMPERATURE = 40, 1.0  # the sampler stored by ``gnq extract`` (one of Hayes et al.'s settings)
METRIC = "suffix_logprob"


def suffix_logprob(model: torch.nn.Module, token_ids: Sequence[Sequence[int]], prefix_tokens: int,
                   suffix_tokens: int, pad: int, *, temperature: float = TEMPERATURE,
                   top_k: int | None = TOP_K, batch_size: int = 32,
                   device: torch.device | None = None, starts: Sequence[int | None] | None = None
                   ) -> list[float]:
    """log q(suffix | prefix) under the sampler, per text (NaN when shorter than p + s).
    ``starts``: each text's window start (attacks/windows.py; None: no window, NaN), the prefix
    being every token before it."""
    if starts is not None:
        return _windowed_logprob(model, token_ids, starts, suffix_tokens, pad, temperature, top_k,
                                 batch_size, device)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    need = prefix_tokens + suffix_tokens
    out = [math.nan] * len(token_ids)
    cut = [list(ids[:need]) for ids in token_ids]
    todo = [i for i, ids in enumerate(token_ids) if len(ids) >= need]
    for chunk, b, logits in forward_batches(model, cut, pad, batch_size, device, order=todo):
        # positions p−1 … p+s−2 predict the suffix tokens p … p+s−1
        step = logits[:, prefix_tokens - 1: need - 1].double() / temperature
        if top_k is not None and top_k < step.shape[-1]:
            kth = step.topk(top_k, dim=-1).values[..., -1:]
            step = step.masked_fill(step < kth, -math.inf)  # ties at the k-th value are kept
        logq = torch.log_softmax(step, dim=-1).gather(-1, b.input_ids[:, prefix_tokens:need, None])
        for i, value in zip(chunk, logq.squeeze(-1).sum(-1).cpu().tolist(), strict=True):
            out[i] = value
    return out


def _windowed_logprob(model, token_ids, starts, suffix_tokens, pad, temperature, top_k, batch_size, device):
    out = [math.nan] * len(token_ids)
    todo = [i for i, (ids, at) in enumerate(zip(token_ids, starts, strict=True))
            if at is not None and len(ids) >= at + suffix_tokens]
    cut = [list(ids[: (at or 0) + suffix_tokens]) for ids, at in zip(token_ids, starts, strict=True)]
    for chunk, b, logits in forward_batches(model, cut, pad, batch_size, device, order=todo):
        for row, i in enumerate(chunk):
            at = starts[i]
            step = logits[row, at - 1: at + suffix_tokens - 1].double() / temperature
            if top_k is not None and top_k < step.shape[-1]:
                kth = step.topk(top_k, dim=-1).values[..., -1:]
                step = step.masked_fill(step < kth, -math.inf)
            target = b.input_ids[row, at: at + suffix_tokens, None]
            out[i] = float(torch.log_softmax(step, dim=-1).gather(-1, target).sum())
    return out


def discoverable(logprob: float | np.ndarray, n: int, p: float) -> bool | np.ndarray:
    """1 − (1 − q)^n ≥ p, computed in logs (q may be far below float precision of 1 − q)."""
    q = np.exp(np.asarray(logprob, dtype=float))
    emitted = -np.expm1(n * np.log1p(-np.minimum(q, 1.0)))
    return emitted >= p
