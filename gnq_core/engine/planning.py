"""The first batch's plan: which tensors carry the batch, and which modules need an enclosing kernel.

Kernels need, for every covered module call, inputs and outputs whose leading dimension is the
batch (or 1: shared by every example).  Shapes alone cannot tell: T5's relative-position bucket
ids are [T, T] and look batch-first whenever T = B; OPT's decoder MLP sees [B·T, d]; a
mixture-of-experts layer routes a flat list of tokens; Mamba's mixer uses its conv's weight
directly.  So before the first batch is audited, ``probe`` runs the forward once with hooks
suspended and follows the batch by provenance: a tensor carries the batch if it was computed
from the model's batch inputs.  A module whose calls are not batch-first, or whose parameters
its parent uses directly, is covered by the generic (per-example vjp) kernel on the nearest
enclosing module whose calls are; where there is none, the plan names the module and why.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

from gnq_core.engine.coverage import UseChecker
from gnq_core.engine.kernels.base import hooks_suspended

_NOT_B = "is not the batch (a flattened or routed batch)"
_PLAIN = (torch.Tensor, int, float, bool, str, type(None), torch.dtype, torch.device)


@dataclass
class Plan:
    """What the probe found (module names as in ``named_modules``; "" is the root)."""

    enclose: dict[str, str] = field(default_factory=dict)  # module -> why its kernel cannot work
    in_dims: dict[str, list[int | None]] = field(default_factory=dict)  # per flat input leaf
    refused: dict[str, str] = field(default_factory=dict)  # module -> why nothing can cover it
    violations: dict[str, str] = field(default_factory=dict)  # parameter -> where it is used


@dataclass
class _CallRecord:
    problem: str | None  # None: every tensor batch-first (or shared by the batch)
    in_dims: list[int | None]


class _Tracker(UseChecker):
    """UseChecker that also tags every tensor computed from the batch inputs."""

    def __init__(self, model: nn.Module, owners: dict, roots: list[torch.Tensor], batch_size: int):
        super().__init__(model, owners)
        self.tags = WeakTensorKeyDictionary()
        for t in roots:
            self.tags[t] = True
        self.batch_size = batch_size
        self.records: dict[str, list[_CallRecord]] = {}
        for name, m in model.named_modules():
            self._handles.append(m.register_forward_hook(
                lambda mod, args, kwargs, out, name=name: self._record(name, args, kwargs, out),
                with_kwargs=True))

    def tagged(self, t: torch.Tensor) -> bool:
        return t in self.tags

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs)
        if any(isinstance(x, torch.Tensor) and x in self.tags for x in tree_flatten((args, kwargs))[0]):
            for o in tree_flatten(out)[0]:
                if isinstance(o, torch.Tensor):
                    self.tags[o] = True
        return out

    def _record(self, name: str, args: tuple, kwargs: dict, output: Any) -> None:
        ins = [x for x in tree_flatten((args, kwargs))[0]]
        outs = [o for o in tree_flatten(output)[0] if isinstance(o, torch.Tensor)]
        B, problem = self.batch_size, None
        if any(isinstance(x, torch.Tensor) and x in self.tags for x in ins):
            for o in outs:  # batch-sized outputs of code the mode did not see (autograd.Functions)
                if o.dim() > 0 and o.shape[0] == B:
                    self.tags[o] = True
        dims: list[int | None] = []
        for x in ins:
            if not isinstance(x, torch.Tensor):
                dims.append(None)
            elif x not in self.tags:  # the same for every example, or built to the batch's size
                if x.dim() > 0 and x.shape[0] == B > 1:
                    if x.stride(0) != 0:  # T5's [T, T] bucket ids when T = B: cannot tell
                        problem = problem or (f"takes a tensor of shape {list(x.shape)} that does not "
                                              "come from the batch but has the batch's size first")
                    else:  # expand(B, ...) of one row (BERT's token types): row j is example j's
                        for o in outs:
                            self.tags[o] = True
                    dims.append(0)
                else:
                    dims.append(None)
            elif x.dim() > 0 and x.shape[0] == B:
                dims.append(0)
            else:
                dims.append(None)
                problem = problem or f"takes a tensor of shape {list(x.shape)} whose first dim {_NOT_B}"
        for o in outs:
            if not o.requires_grad:
                continue
            if o in self.tags and not (o.dim() > 0 and o.shape[0] == B):
                problem = problem or f"returns a tensor of shape {list(o.shape)} whose first dim {_NOT_B}"
            elif o not in self.tags and not (o.dim() > 0 and o.shape[0] == 1):
                problem = problem or (f"returns a tensor of shape {list(o.shape)} computed from its "
                                      "parameters alone, shared by the batch without a batch dimension")
        self.records.setdefault(name, []).append(_CallRecord(problem, dims))


def probeable(args: tuple, kwargs: dict) -> bool:
    """Only plain tensors and scalars: a cache object would be advanced by a second forward."""
    return all(isinstance(x, _PLAIN) for x in tree_flatten((args, kwargs))[0])


@contextlib.contextmanager
def _no_side_effects(model: nn.Module) -> Iterator[None]:
    """Same random numbers afterwards, and buffers (BatchNorm statistics, spectral_norm's power
    iteration vectors) left as they were."""
    saved = {id(m): {k: v.clone() for k, v in m.named_buffers(recurse=False) if v is not None}
             for m in model.modules()}
    devices = sorted({p.device.index for p in model.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices), hooks_suspended():
        try:
            yield
        finally:
            with torch.no_grad():
                for m in model.modules():
                    for k, v in saved.get(id(m), {}).items():
                        getattr(m, k).copy_(v)


def probe(model: nn.Module, args: tuple, kwargs: dict, batch_size: int,
          covered: dict[str, list[int]], owners: dict) -> Plan:
    """One forward with hooks suspended; ``covered``: hooked module name -> its parameter ids,
    ``owners``: as for ``UseChecker``."""
    roots = [x for x in tree_flatten((args, kwargs))[0]
             if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == batch_size]
    tracker = _Tracker(model, owners, roots, batch_size)
    try:
        with _no_side_effects(model), tracker:
            model(*args, **kwargs)
    finally:
        tracker.remove_hooks()
    return _decide(model, tracker, covered)


def _ancestors(name: str) -> Iterator[str]:
    while name:
        name = name.rpartition(".")[0]
        yield name


def _common_ancestor(a: str, b: str) -> str:
    """The innermost module containing both (by qualified name; "" is the root)."""
    for name in (a, *_ancestors(a)):
        if b == name or b.startswith(f"{name}.") or name == "":
            return name
    return ""


def _decide(model: nn.Module, tracker: _Tracker, covered: dict[str, list[int]]) -> Plan:
    plan = Plan()
    records = tracker.records

    def problem_of(name: str) -> str | None:
        return next((r.problem for r in records.get(name, []) if r.problem), None)

    def enclosing(name: str) -> str | None:
        return next((a for a in _ancestors(name) if a in records and problem_of(a) is None), None)

    wanted: dict[str, str] = {}
    for name in covered:
        problem = problem_of(name)
        if problem is None:
            continue
        outer = enclosing(name)
        if outer is None:
            plan.refused[name] = problem
        else:
            wanted.setdefault(outer, f"'{name}' {problem}")
    by_param = {p: n for n, ids in covered.items() for p in ids}
    names = {id(p): n for n, p in model.named_parameters()}
    for param_name, user in tracker.users.items():
        pid = next(i for i, n in names.items() if n == param_name)
        owner = by_param.get(pid)
        if user is not None and owner is not None:  # both inside the model: enclose both
            common = _common_ancestor(user, owner)
            outer = common if common in records and problem_of(common) is None else enclosing(common)
            if outer is not None:
                wanted.setdefault(outer, f"it uses '{param_name}' in '{user or '<root>'}'")
                continue
        plan.violations[param_name] = tracker.violations[param_name]
    for name in wanted:  # an enclosing module inside another one is covered by the outer one
        if not any(a in wanted for a in _ancestors(name)):
            plan.enclose[name] = wanted[name]
    inside = [n for n in records if any(a in plan.enclose for a in _ancestors(n))]
    for name, calls in records.items():
        if name not in inside and calls:
            plan.in_dims[name] = calls[0].in_dims
    plan.refused = {n: r for n, r in plan.refused.items()
                    if not any(a in plan.enclose for a in _ancestors(n))}
    return plan
