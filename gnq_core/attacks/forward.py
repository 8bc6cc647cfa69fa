"""The one batched no-grad forward loop: a model in eval mode under ``torch.inference_mode``
(its training mode restored afterwards), over right-padded batches of token ids."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from gnq_core.sources.tokens import LMBatch, collate

__all__ = ["evaluating", "forward_batches", "model_device"]


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (CPU for a model without parameters)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


@contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The model in eval mode under ``torch.inference_mode``; its training mode restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield model
    finally:
        model.train(was_training)


def forward_batches(model: torch.nn.Module, token_ids: Sequence[Sequence[int]], pad: int,
                    batch_size: int = 32, device: torch.device | None = None,
                    order: Sequence[int] | None = None,
                    ) -> Iterator[tuple[list[int], LMBatch, torch.Tensor]]:
    """(indices, batch, logits) for each run of ``batch_size`` indices of ``order`` (default: all,
    in order): ``batch`` collates ``token_ids`` at those indices (its example ids are the
    indices), ``logits`` is the model's output on it.  Under ``evaluating(model)``."""
    device = device if device is not None else model_device(model)
    order = list(range(len(token_ids))) if order is None else list(order)
    with evaluating(model):
        for start in range(0, len(order), batch_size):
            chunk = order[start: start + batch_size]
            b = collate([token_ids[i] for i in chunk], chunk, pad).to(device)
            yield chunk, b, model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
