"""The per-example loss convention GNQ is defined with (DESIGN.md §1).

GNQ depends on the scale of each gradient relative to λ, so ℓ_j must not depend on the batch:
for a causal LM it is example j's mean next-token NLL over its own non-ignored targets (the
default convention, ``token_mean``), or their sum (``token_sum``: ℓ_j = n_j · the mean, so
g_j = n_j · the mean's gradient and K_jj grows with n_j²; the paper's GPT-2 runs summed).  The
convention is a setting of every GNQ run and is recorded with it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gnq_core.engine.math.conventions import IGNORE_INDEX, TOKEN_MEAN, TOKEN_SUM, check_loss_convention


def per_example_lm_loss(logits: torch.Tensor, labels: torch.Tensor,
                        convention: str = TOKEN_MEAN, *, label_smoothing: float = 0.0,
                        shift: bool = True) -> torch.Tensor:
    """Each sequence's mean (``token_sum``: summed) next-token NLL over its targets with
    label != -100; shape [B].

    ``logits`` [B, T, V] predict position t+1 from position t (Hugging Face convention: pass
    labels = input_ids with padding set to -100; the shift happens here; ``shift=False``: position
    t predicts label t, as a masked LM's).  A sequence with no target gets loss 0 (and so zero
    gradient).  ``label_smoothing`` ε: each target's loss is (1 − ε)·NLL + ε·(mean over the
    vocabulary of −log p), transformers' ``LabelSmoother`` per token, so ℓ_j is still example j's
    own and Σ_j n_j ℓ_j / N is the Trainer's smoothed loss.
    """
    check_loss_convention(convention)
    if not (isinstance(label_smoothing, int | float) and 0.0 <= label_smoothing < 1.0):
        raise ValueError(f"label_smoothing must be a number in [0, 1), got {label_smoothing!r}")
    if logits.dim() != 3 or labels.shape != logits.shape[:2]:
        raise ValueError(f"expected logits [B, T, V] and labels [B, T], got "
                         f"{tuple(logits.shape)} and {tuple(labels.shape)}")
    shift_logits = logits[:, :-1, :] if shift else logits
    if shift_logits.dtype not in (torch.float32, torch.float64):
        shift_logits = shift_logits.float()  # bf16/fp16: NLL in fp32
    shift_labels = labels[:, 1:] if shift else labels
    nll = F.cross_entropy(shift_logits.reshape(-1, shift_logits.shape[-1]),
                          shift_labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none",
                          label_smoothing=float(label_smoothing))
    nll = nll.view(shift_labels.shape)
    if convention == TOKEN_SUM:
        return nll.sum(dim=1)
    counts = lm_target_counts(labels, shift=shift)
    return nll.sum(dim=1) / counts.clamp(min=1).to(nll.dtype)


def lm_target_counts(labels: torch.Tensor, *, shift: bool = True) -> torch.Tensor:
    """Number of targets per sequence (next-token targets unless ``shift=False``), [B]."""
    return ((labels[:, 1:] if shift else labels) != IGNORE_INDEX).sum(dim=1)


def lm_token_mean_weights(labels: torch.Tensor) -> torch.Tensor:
    """w_j = n_j / N: Hugging Face's token-mean loss is Σ_j w_j ℓ_j with these weights."""
    counts = lm_target_counts(labels).to(torch.float64)
    return counts / counts.sum()


def batch_mean_weights(labels: torch.Tensor, convention: str = TOKEN_MEAN) -> torch.Tensor:
    """w_j with Σ_j w_j ℓ_j = the batch mean of the per-example *token means* (the training
    objective, whatever the convention GNQ is measured in): 1/B for ``token_mean``, 1/(B n_j)
    for ``token_sum`` (a text without targets gets 1/B: its loss and gradient are 0 anyway)."""
    B = labels.shape[0]
    if check_loss_convention(convention) == TOKEN_MEAN:
        return torch.full((B,), 1.0 / B, dtype=torch.float64)
    counts = lm_target_counts(labels).to(torch.float64).cpu().clamp(min=1)
    return 1.0 / (B * counts)
