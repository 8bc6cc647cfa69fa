"""The one greedy decoder of the attacks: batched, left-padded prompts with a KV cache, exactly
``n_new`` tokens each (no EOS stopping).  It gives the same ids as recomputing the full, unpadded
forward for each example at every step (tests/test_extraction.py checks this)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch

from gnq_core.pipelines.attacks.forward import model_device

__all__ = ["greedy_decode"]


def _accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def greedy_decode(model: torch.nn.Module, prompts: Sequence[Sequence[int]], n_new: int, pad: int,
                  device: torch.device | None = None) -> list[list[int]]:
    """Greedily generate ``n_new`` tokens after each prompt, batched (left padding + KV cache).

    Prompts may differ in length (each needs at least one token). No EOS stopping. Call inside
    ``torch.inference_mode()`` with the model in eval mode (``extraction_attack`` does both).
    """
    if not prompts or n_new <= 0:
        return [[] for _ in prompts]
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    device = device if device is not None else model_device(model)
    B, width = len(prompts), max(len(p) for p in prompts)
    input_ids = torch.full((B, width), pad, dtype=torch.long)
    mask = torch.zeros((B, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        input_ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
        mask[i, width - len(p):] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    # Positions count real tokens only: the first real token of every row is position 0.
    position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
    extra = {"logits_to_keep": 1} if _accepts_logits_to_keep(model) else {}

    out_ids = torch.empty((B, n_new), dtype=torch.long, device=device)
    past = None
    for step in range(n_new):
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                    cache=past, use_cache=True, **extra)  # transformers 5: `cache`, not `past_key_values`
        nxt = out.logits[:, -1, :].argmax(dim=-1)
        out_ids[:, step] = nxt
        if step == n_new - 1:
            break
        past = out.cache
        input_ids = nxt[:, None]
        position_ids = position_ids[:, -1:] + 1
        mask = torch.cat([mask, mask.new_ones((B, 1))], dim=1)
    return out_ids.tolist()
