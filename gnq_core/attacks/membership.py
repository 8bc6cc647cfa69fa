"""Calibrated membership scores: how much better the audited model predicts a text than a
reference model that did not learn it, or than a generic compressor.

A low loss alone mostly says a text is *easy* (short, common words, a formula); the literature
calibrates it (Carlini et al. 2021 "Extracting training data", §6; Mireshghallah et al. 2022;
Shi et al. 2024 "Min-K% prob"):

* ``loss_ratio``  = the text's mean next-token NLL under the audited model / under the
  reference (the run's first checkpoint, or the base model of a fine-tune).  1: learned no more
  than the reference; 0.25: loss 4× below the reference's.  Lower = more memorised.
* ``zlib_ratio``  = the bits the audited model needs to encode the text (summed NLL in bits)
  / the bits zlib needs (8 × compressed length).  Lower = the model predicts the text far better
  than its surface redundancy explains.
* ``min_k_prob``  = the mean log-probability (nats) of the k = 20% least likely tokens.  An
  unseen text has a few very unlikely tokens; a memorised one has none.  Higher (closer to 0)
  = more likely a training member.
* Min-K%++ (Zhang et al. 2024, the strongest reference-free signal in MIMIR-style benchmarks):
  each token's log p(x_t) standardised by the mean μ_t and standard deviation σ_t of log p under
  the model's own next-token distribution, (log p(x_t) − μ_t)/σ_t, averaged over the lowest k%.
  A token is surprising only relative to how spread out the model's prediction is there.

``token_signals`` computes Min-K% and Min-K%++ from the logits of a forward pass that also gives
the loss (``gnq audit``/``gnq train`` store them per text and point as ``min_k``/``min_k_plus``).

Token convention as everywhere (``sources.tokens``): a text's tokens without special tokens,
each token after the first predicted from the ones before it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from gnq_core.attacks.compression import zlib_bits
from gnq_core.attacks.forward import forward_batches
from gnq_core.engine.math.conventions import IGNORE_INDEX

MIN_K_FRACTION = 0.2
TOKEN_SIGNALS = ("min_k", "min_k_plus")  # scores columns token_signals fills, per text and point
SCORE_COLUMNS = ["attack_loss", "reference_loss", "loss_ratio", "zlib_ratio", "min_k_prob"]


def token_logprobs(model: torch.nn.Module, token_ids: Sequence[Sequence[int]], pad: int,
                   batch_size: int = 32, device: torch.device | None = None) -> list[np.ndarray]:
    """log p(x_t | x_<t) for t = 1..n-1 of every text (float64; empty for a one-token text)."""
    out: list[np.ndarray] = []
    fed = [list(x) or [pad] for x in token_ids]
    for chunk, b, logits in forward_batches(model, fed, pad, batch_size, device):
        logp = torch.log_softmax(logits[:, :-1].double(), dim=-1)
        picked = logp.gather(-1, b.input_ids[:, 1:, None]).squeeze(-1).cpu().numpy()
        out += [picked[row, : max(0, len(token_ids[i]) - 1)] for row, i in enumerate(chunk)]
    return out


def min_k_prob(logprobs: np.ndarray, k: float = MIN_K_FRACTION) -> float:
    """Mean of the lowest ⌈k·n⌉ token log-probabilities (NaN when there is no predicted token)."""
    if len(logprobs) == 0:
        return float("nan")
    m = max(1, math.ceil(k * len(logprobs)))
    return float(np.sort(logprobs)[:m].mean())


def token_signals(logits: torch.Tensor, labels: torch.Tensor, k: float = MIN_K_FRACTION
                  ) -> dict[str, np.ndarray]:
    """Per sequence of the batch: ``min_k`` (Min-K%) and ``min_k_plus`` (Min-K%++) over its
    next-token targets (labels != -100, the shift as in ``per_example_lm_loss``); NaN for a
    sequence without targets.  Forward quantities only (detached; no graph is kept)."""
    with torch.no_grad():
        lg = logits[:, :-1].detach()
        if lg.dtype not in (torch.float32, torch.float64):
            lg = lg.float()
        target = labels[:, 1:]
        valid = target != IGNORE_INDEX
        logp = torch.log_softmax(lg, dim=-1)
        picked = logp.gather(-1, target.clamp_min(0)[..., None]).squeeze(-1)
        p = logp.exp()
        mu = torch.where(p > 0, p * logp, 0).sum(-1)  # E_{v~p}[log p(v)] (0·log 0 = 0)
        var = torch.where(p > 0, p * (logp - mu[..., None]).square(), 0).sum(-1)
        plus = (picked - mu) / var.clamp_min(torch.finfo(var.dtype).tiny).sqrt()
        return {"min_k": _lowest_mean(picked, valid, k), "min_k_plus": _lowest_mean(plus, valid, k)}


def _lowest_mean(values: torch.Tensor, valid: torch.Tensor, k: float) -> np.ndarray:
    """Per row, the mean of the lowest ⌈k·n⌉ of its n valid values (NaN when n = 0)."""
    n = valid.sum(-1)
    m = torch.ceil(k * n.double()).long().clamp_min(1)
    ordered = values.double().masked_fill(~valid, math.inf).sort(-1).values
    take = torch.arange(ordered.shape[-1], device=ordered.device)[None] < m[:, None]
    means = torch.where(take, ordered, 0).sum(-1) / m
    return torch.where(n > 0, means, math.nan).cpu().numpy()


def membership_scores(texts: Sequence[str], target: Sequence[np.ndarray],
                      reference: Sequence[np.ndarray] | None, k: float = MIN_K_FRACTION) -> pd.DataFrame:
    """Per text: ``attack_loss`` / ``reference_loss`` (mean NLL, nats), ``loss_ratio``,
    ``zlib_ratio`` and ``min_k_prob`` (NaN where a text has no predicted token, and the
    reference columns NaN without a reference)."""
    rows = []
    for i, (text, lp) in enumerate(zip(texts, target, strict=True)):
        loss = float(-lp.mean()) if len(lp) else float("nan")
        ref = float(-reference[i].mean()) if reference is not None and len(reference[i]) else float("nan")
        bits = float(-lp.sum()) / math.log(2) if len(lp) else float("nan")
        rows.append((loss, ref, loss / ref if ref > 0 else float("nan"), bits / zlib_bits(text),
                     min_k_prob(lp, k)))
    return pd.DataFrame(rows, columns=SCORE_COLUMNS)
