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

Token convention as everywhere (``sources.tokens``): a text's tokens without special tokens,
each token after the first predicted from the ones before it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from gnq_core.sources.tokens import collate

MIN_K_FRACTION = 0.2
SCORE_COLUMNS = ["attack_loss", "reference_loss", "loss_ratio", "zlib_ratio", "min_k_prob"]


def token_logprobs(model: torch.nn.Module, token_ids: Sequence[Sequence[int]], pad: int,
                   batch_size: int = 32, device: torch.device | None = None) -> list[np.ndarray]:
    """log p(x_t | x_<t) for t = 1..n-1 of every text (float64; empty for a one-token text)."""
    device = device if device is not None else next(model.parameters()).device
    out: list[np.ndarray] = []
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for start in range(0, len(token_ids), batch_size):
                ids = [list(x) or [pad] for x in token_ids[start: start + batch_size]]
                b = collate(ids, list(range(len(ids))), pad).to(device)
                logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
                logp = torch.log_softmax(logits[:, :-1].double(), dim=-1)
                picked = logp.gather(-1, b.input_ids[:, 1:, None]).squeeze(-1).cpu().numpy()
                out += [picked[i, : max(0, len(token_ids[start + i]) - 1)] for i in range(len(ids))]
    finally:
        model.train(was_training)
    return out


def min_k_prob(logprobs: np.ndarray, k: float = MIN_K_FRACTION) -> float:
    """Mean of the lowest ⌈k·n⌉ token log-probabilities (NaN when there is no predicted token)."""
    if len(logprobs) == 0:
        return float("nan")
    m = max(1, math.ceil(k * len(logprobs)))
    return float(np.sort(logprobs)[:m].mean())


def zlib_bits(text: str) -> int:
    return 8 * len(zlib.compress(text.encode("utf-8")))


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
