"""What the batch is to the auditor: the leading dimension of every covered module's tensors.

``leading_dim`` reads a call's batch size from its inputs; ``batch_first_outputs`` checks a
module's differentiable outputs against it (a [1, ...] output broadcast over the batch is
expanded so each example's output gradient is seen) and raises ``BatchDimensionError``, naming
the model family and the module, where an output is not batch-first.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from gnq_core.engine.plan.frontier import used_inside
from gnq_core.errors import GNQError


class BatchDimensionError(GNQError, ValueError):
    """A covered module saw a tensor whose leading dimension is not the batch."""


def module_label(model: nn.Module, name: str, module: nn.Module) -> str:
    """How messages name a module: the model's family (its config's ``model_type``, else its
    class name), the module's name and its type."""
    family = getattr(getattr(model, "config", None), "model_type", None) or type(model).__name__
    return f"{family}: module '{name}' ({type(module).__name__})"


def leading_dim(args: tuple, kwargs: dict) -> int | None:
    """The leading dimension of a call's first tensor input (None: no tensor input)."""
    for leaf in tree_flatten((args, kwargs))[0]:
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    return None


def batch_first_outputs(flat_out: list, diff: list[int], batch_size: int, model: nn.Module, name: str,
                        module: nn.Module) -> bool:
    """Check the outputs ``flat_out[i]``, i in ``diff``, of module ``name`` are batch-first; replace
    in place those the hook must see as other tensors (broadcast ones expanded to the batch, and
    views of those the module also uses inside itself).  Whether any was replaced."""
    B = batch_size
    expanded = False
    for i in diff:
        o = flat_out[i]
        if o.dim() == 0 or o.shape[0] not in (1, B):
            raise BatchDimensionError(
                f"{module_label(model, name, module)} returned shape {tuple(o.shape)}; "
                f"per-example gradients need batch-first outputs [B={B}, ...]")
        if o.shape[0] == 1 and B > 1:  # broadcast over the batch (e.g. position embeddings):
            flat_out[i] = o.expand(B, *o.shape[1:])  # expand so each example's Δ is seen
            expanded = True
    for i in used_inside(flat_out, diff):  # the hook must see only the uses outside the module
        flat_out[i] = flat_out[i].view_as(flat_out[i])
        expanded = True
    return expanded
