"""Activation (gradient) checkpointing: forwards that run again inside the backward.

``torch.utils.checkpoint`` (what ``model.gradient_checkpointing_enable()`` and
``Trainer(gradient_checkpointing=True)`` use) drops a region's activations in the forward and
recomputes them in the backward.  Each module call of the batch must reach the kernel exactly
once, so the auditor tells the two kinds apart by what the forward already registered:

- ``use_reentrant=False``: the region's forward ran with gradients on, its calls were captured
  then and their output gradients arrive through the original graph; the recomputation only
  refills saved tensors (its outputs never receive a gradient).  Its calls are *duplicates*:
  skipped (a fused layer runs its fused function again, so the recomputation saves the same
  tensors, with a sink that records nothing).
- ``use_reentrant=True``: the region's forward ran without gradients (nothing was captured), and
  the recomputation is the one forward whose outputs receive gradients, in a nested backward:
  its calls are captured as usual.

Per module: the first ``forward_calls`` recomputations in a pass are duplicates, any further one
is captured.  (A module called both inside and outside a checkpointed region in one pass would
need its calls matched one by one; the counts keep them apart as long as the regions recompute
in the reverse order of the forward, which torch.utils.checkpoint does.)
"""

from __future__ import annotations

import torch
from torch import nn

from gnq_core.engine.passes.pass_state import PassState


def in_backward() -> bool:
    """Whether autograd is running a backward on this thread (a recomputation runs inside one)."""
    return torch._C._current_graph_task_id() != -1


def note_forward_call(p: PassState, module: nn.Module) -> None:
    """A call registered by the forward (outside any backward)."""
    if not in_backward():
        p.forward_calls[id(module)] += 1


def is_duplicate(p: PassState, module: nn.Module, *, count: bool = True) -> bool:
    """Inside a backward: whether this call recomputes one the forward already captured
    (counted unless ``count`` is False: a pre-hook asks before the call's own hook counts it;
    a ``False`` call is to be captured, as a reentrant recomputation's is)."""
    key = id(module)
    if p.recomputed[key] < p.forward_calls[key]:
        p.recomputed[key] += count
        return True
    return False


def shared_before(p: PassState, param_ids: tuple[int, ...] | list[int], module: nn.Module) -> bool:
    """For a duplicate fused call: whether its weight was used beyond lookups by *other* calls, as
    the forward's call saw it (by now the pass also counts that call itself), so the
    recomputation takes the same path and saves the same tensors."""
    own = p.forward_calls[id(module)]
    return any(pid in p.used_beyond_lookups and p.uses[pid] > own for pid in param_ids)
