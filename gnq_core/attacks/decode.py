"""The one greedy decoder of the attacks: batched, left-padded prompts with a KV cache, exactly
``n_new`` tokens each (no EOS stopping).  It gives the same ids as recomputing the full, unpadded
forward for each example at every step (tests/attacks/test_extraction.py checks this)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from gnq_core.attacks.forward import model_device

__all__ = ["cache_argument", "forward_parameters", "greedy_decode", "returned_cache"]


def forward_parameters(model: torch.nn.Module) -> set[str]:
    """The names the model's forward takes (empty where they cannot be read)."""
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def cache_argument(model: torch.nn.Module) -> str:
    """The forward's name for the KV cache: ``cache`` (transformers ≥ 5.24, where
    ``past_key_values`` is deprecated, to go in 5.40) or ``past_key_values`` (earlier releases)."""
    return "cache" if "cache" in forward_parameters(model) else "past_key_values"


def returned_cache(out: Any) -> Any:
    """The cache a forward returned: a ModelOutput's read by key (its deprecated attribute alias
    ``past_key_values`` logs a warning), any other output's by attribute."""
    if isinstance(out, Mapping):
        return next((out[k] for k in ("cache", "past_key_values") if k in out), None)
    cache = getattr(out, "cache", None)
    return getattr(out, "past_key_values", None) if cache is None else cache


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
    extra = {"logits_to_keep": 1} if "logits_to_keep" in forward_parameters(model) else {}
    cache_name = cache_argument(model)

    out_ids = torch.empty((B, n_new), dtype=torch.long, device=device)
    past = None  # the first call makes the model's own kind of cache (KV, a state-space model's state)
    for step in range(n_new):
        cache = {} if past is None else {cache_name: past}
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                    use_cache=True, **cache, **extra)
        nxt = out.logits[:, -1, :].argmax(dim=-1)
        out_ids[:, step] = nxt
        if step == n_new - 1:
            break
        past = returned_cache(out)
        input_ids = nxt[:, None]
        position_ids = position_ids[:, -1:] + 1
        mask = torch.cat([mask, mask.new_ones((B, 1))], dim=1)
    return out_ids.tolist()
