"""The first batch's plan, kept for the next checkpoint of the same audit.

A plan (``engine.plan.planning``) is what one forward of the first batch showed: which module calls
see batch-first tensors and which parameters are used where.  It is made from the model's code
and structure and the batch.  Weights enter in two ways.  Through the forward's path: which
modules run, with what (a router's choice, a branch on a value); this is checked.  And through
the probe's comparison of each call's float tensors between its two batches, which tells whether
a call's rows are its own examples': a call whose rows mix the examples looks batch-first only
where the mixing term vanishes at those very weights, which is the assumption one plan already
makes for every later batch of a checkpoint and, in training, every later step as the weights
change (a difference of rounding alone is batch-first either way, and both kernels are exact).
So a plan is reused only when the model's class, config, modules, parameters (names, shapes,
dtypes, devices, requires_grad, which are tied), buffers, hooks and the auditor's kernel
assignment are the same, the first batch is the same tensor for tensor, and one checking forward
of that batch at the new weights makes the same module calls as the probe's did (name, order,
tensor shapes, integer and boolean tensors' values, numbers).  Anything else is planned anew.
The check costs one forward, where the probe costs two (one on B+1 examples, copying every module
call's tensors) and their comparisons.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from gnq_core.engine.plan.assignment import Hooked
from gnq_core.engine.plan.planning import Plan, calls_of

# config entries that name where a checkpoint was read from, not what it computes
_WHERE_FROM = ("_name_or_path", "name_or_path")


@dataclass
class _Kept:
    structure: tuple
    batch: tuple[Any, list[Any]]  # its pytree spec, its leaves
    plan: Plan


class PlanCache:
    """The last plan of an audit's checkpoints; ``probes``/``reused`` count what happened."""

    def __init__(self) -> None:
        self._kept: _Kept | None = None
        self.probes = 0
        self.reused = 0

    def reuse(self, model: nn.Module, hooked: list[Hooked], args: tuple, kwargs: dict) -> Plan | None:
        """The kept plan, if ``model`` and the batch are provably what it was made from; else None."""
        kept = self._kept
        if kept is None or structure(model, hooked) != kept.structure:
            return None
        if not _same_batch(kept.batch, args, kwargs):
            return None
        if calls_of(model, args, kwargs) != kept.plan.calls:  # the forward took another path
            return None
        self.reused += 1
        return _copied(kept.plan)

    def keep(self, model: nn.Module, hooked: list[Hooked], args: tuple, kwargs: dict, plan: Plan) -> None:
        self.probes += 1
        flat, spec = tree_flatten((args, kwargs))
        batch = [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in flat]
        self._kept = _Kept(structure(model, hooked), (spec, batch), _copied(plan))


def structure(model: nn.Module, hooked: list[Hooked]) -> tuple:
    """Everything about ``model`` a plan is made from besides its weights' values and the batch."""
    config = getattr(model, "config", None)
    settings: Any = None
    if config is not None:
        to_dict = getattr(config, "to_dict", None)  # a transformers config; else its repr decides
        entries = (repr(sorted((k, repr(v)) for k, v in to_dict().items() if k not in _WHERE_FROM))
                   if callable(to_dict) else repr(config))
        settings = (entries, getattr(config, "_attn_implementation", None),
                    getattr(config, "_experts_implementation", None))
    first: dict[int, str] = {}
    params = tuple((name, tuple(p.shape), p.dtype, p.device, p.requires_grad, first.setdefault(id(p), name))
                   for name, p in model.named_parameters(remove_duplicate=False))
    buffers = tuple((name, tuple(b.shape), b.dtype, b.device) for name, b in model.named_buffers())
    modules = tuple((name, type(m).__module__, type(m).__qualname__, m.training, "forward" in vars(m),
                     len(m._forward_pre_hooks), len(m._forward_hooks))
                    for name, m in model.named_modules(remove_duplicate=False))
    kernels = tuple((h.name, type(h.kernel).__qualname__, h.kernel.name, tuple(h.params)) for h in hooked)
    return type(model).__module__, type(model).__qualname__, settings, params, buffers, modules, kernels


def _copied(plan: Plan) -> Plan:
    """Its own dicts and lists (kernels bind ``in_dims``' lists: no two auditors share them); the
    calls are tuples, shared."""
    return replace(plan, enclose=dict(plan.enclose), refused=dict(plan.refused),
                   violations=dict(plan.violations), in_dims={k: list(v) for k, v in plan.in_dims.items()})


def _same_batch(kept: tuple[Any, list[Any]], args: tuple, kwargs: dict) -> bool:
    """The same arguments by name and position, every tensor equal to the last bit."""
    flat, spec = tree_flatten((args, kwargs))
    kept_spec, kept = kept
    if spec != kept_spec or len(flat) != len(kept):
        return False
    for a, b in zip(kept, flat, strict=True):
        if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
            return False
        if isinstance(a, torch.Tensor):
            if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device or not torch.equal(a, b):
                return False
        elif type(a) is not type(b) or a != b:
            return False
    return True
