"""The first batch's plan: which tensors carry the batch, and which modules need an enclosing kernel.

Kernels need, for every covered module call, inputs and outputs whose leading dimension is the
batch (or 1: shared by every example).  Shapes alone cannot tell: T5's relative-position bucket
ids are [T, T] and look batch-first whenever T = B; a sequence-first [T, B, d] tensor looks
batch-first whenever T = B; OPT's decoder MLP sees [B·T, d]; a mixture-of-experts layer routes a
flat list of tokens; Mamba's mixer uses its conv's weight directly.  So before the first batch is
audited, ``probe`` runs the forward twice with hooks suspended (dropout off, layer drop drawing
the same numbers in both): on the batch, and
on a second batch of B+1 examples drawn from it (reversed, the last one twice).  A tensor carries
the examples along its first dimension only if that dimension, and no other, went from B to B+1
and its rows are the first batch's rows in the second batch's order; a tensor that did not change
is shared by the batch.  Anything else (examples along another dimension, a flattened, routed or
mixed batch) is not batch-first, whatever its sizes.  A module whose calls are not batch-first,
or whose parameters its parent uses directly, is covered by the generic (per-example vjp) kernel
on the nearest enclosing module whose calls are; where there is none, the plan names the module
and why.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from gnq_core.engine.kernels.base import UnsupportedModuleError, hooks_suspended
from gnq_core.engine.kernels.registry import refusal
from gnq_core.engine.plan.batch import module_label
from gnq_core.engine.plan.coverage import UseChecker

_NOT_B = "is not the batch (its examples lie along another dim, or a flattened, routed or mixed batch)"
_PLAIN = (torch.Tensor, int, float, bool, str, type(None), torch.dtype, torch.device)
# how far a tensor may differ between the two probe batches and still hold the same examples
# (batched kernels round differently for different batch sizes)
_SAME_TOL = {torch.float64: 1e-7, torch.float32: 1e-3}


@dataclass
class Plan:
    """What the probe found (module names as in ``named_modules``; "" is the root)."""

    enclose: dict[str, str] = field(default_factory=dict)  # module -> why its kernel cannot work
    in_dims: dict[str, list[int | None]] = field(default_factory=dict)  # per flat input leaf
    refused: dict[str, str] = field(default_factory=dict)  # module -> why nothing can cover it
    violations: dict[str, str] = field(default_factory=dict)  # parameter -> where it is used
    # every module call of the probed forward, in order (``calls_of``): a later model's forward on
    # the same batch must make the same calls for this plan to be reused (engine/plan/plan_reuse.py)
    calls: list[tuple] = field(default_factory=list, compare=False, repr=False)


@dataclass
class _CallRecord:
    problem: str | None  # None: every tensor batch-first (or shared by the batch)
    in_dims: list[int | None]


Leaves = list[Any]
_SCALARS = (int, float, bool, str)


def _leaves(tree: Any) -> Leaves:
    """Tensors cloned, numbers kept (a size that differs between the probe batches carries the
    batch too), other objects as None."""
    return [x.detach().clone() if isinstance(x, torch.Tensor) else x if isinstance(x, _SCALARS) else None
            for x in tree_flatten(tree)[0]]


class _Recorder:
    """Every module call's input and output tensors (the second probe batch's)."""

    def __init__(self, model: nn.Module):
        self.calls: dict[str, list[tuple[Leaves, Leaves]]] = {}
        self._handles = [m.register_forward_hook(
            lambda mod, args, kwargs, out, name=name: self.calls.setdefault(name, []).append(
                (_leaves((args, kwargs)), _leaves(out))), with_kwargs=True)
            for name, m in model.named_modules()]

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()


def _call_shape(tree: Any) -> tuple:
    """A call's structure: its pytree spec, each tensor's shape, dtype, device and requires_grad
    (an integer or boolean tensor's values too, by digest: token ids, masks, a router's choices),
    numbers and strings by value, other objects by type."""
    flat, spec = tree_flatten(tree)
    return spec, tuple(_tensor_shape(x) if isinstance(x, torch.Tensor)
                       else x if isinstance(x, _SCALARS) else type(x).__qualname__ for x in flat)


def _tensor_shape(x: torch.Tensor) -> tuple:
    digest: object = None
    if not x.is_floating_point() and not x.is_complex():
        try:
            data = x.detach().reshape(-1).cpu().contiguous().view(torch.uint8).numpy()
            digest = hashlib.blake2b(data.tobytes(), digest_size=16).hexdigest()
        except (RuntimeError, TypeError, NotImplementedError):
            # unreadable (meta, sparse): a fresh object equals no other, so a reused plan never matches
            digest = object()
    return tuple(x.shape), x.dtype, x.device, x.requires_grad, digest


class _Calls:
    """Every module call of a forward, in order: its name, its inputs' and its output's structure."""

    def __init__(self, model: nn.Module):
        self.calls: list[tuple] = []
        self._handles = [m.register_forward_hook(
            lambda mod, args, kwargs, out, name=name: self.calls.append(
                (name, _call_shape((args, kwargs)), _call_shape(out))), with_kwargs=True)
            for name, m in model.named_modules()]

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point() and not a.is_complex():
        return bool(torch.equal(a, b))
    tol = _SAME_TOL.get(a.dtype, 5e-2)
    scale = float(b.abs().nan_to_num(0, 0, 0).max()) if b.numel() else 0.0
    return bool(torch.allclose(a, b.to(a.device), rtol=tol, atol=tol * scale, equal_nan=True))


def _layout(x: torch.Tensor, x2: torch.Tensor | None, index: torch.Tensor | None) -> str:
    """"batch" (examples along dim 0), "shared" (the same for every batch) or "other"."""
    if index is None:  # one example: nothing to tell apart, a leading 1 is that example
        return "batch" if x.dim() > 0 and x.shape[0] == 1 else "shared"
    if x2 is None:
        return "other"
    B, B2 = int(index.max()) + 1, len(index)
    if (x.dim() > 0 and x.shape[0] == B and tuple(x2.shape) == (B2, *x.shape[1:])
            and _same(x[index.to(x.device)], x2)):
        return "batch"
    if x2.shape == x.shape and _same(x, x2):
        return "shared"
    return "other"


class _Tracker(UseChecker):
    """UseChecker that also compares every module call with the second probe batch's."""

    def __init__(self, model: nn.Module, owners: dict, reference: dict[str, list[tuple[Leaves, Leaves]]],
                 index: torch.Tensor | None):
        super().__init__(model, owners)
        self.reference, self.index = reference, index
        self.records: dict[str, list[_CallRecord]] = {}
        for name, m in model.named_modules():
            self._handles.append(m.register_forward_hook(
                lambda mod, args, kwargs, out, name=name: self._record(name, args, kwargs, out),
                with_kwargs=True))

    def _record(self, name: str, args: tuple, kwargs: dict, output: Any) -> None:
        ins = tree_flatten((args, kwargs))[0]
        outs = tree_flatten(output)[0]
        k = len(self.records.get(name, []))
        ref = self.reference.get(name, [])
        ref_in, ref_out = ref[k] if k < len(ref) else ([], [])
        if self.index is not None and (len(ref_in) != len(ins) or len(ref_out) != len(outs)):
            problem = ("is called differently for another batch of the same examples, so which "
                       "dimension of its tensors carries the examples cannot be proven")
            self.records.setdefault(name, []).append(_CallRecord(problem, [None] * len(ins)))
            return
        problem, dims = None, []
        for i, x in enumerate(ins):
            if not isinstance(x, torch.Tensor):
                dims.append(None)
                if ref_in and isinstance(x, _SCALARS) and x != ref_in[i]:
                    problem = problem or f"takes a number ({x!r}) that changes with the batch"
                continue
            layout = _layout(x, ref_in[i] if ref_in else None, self.index)
            dims.append(0 if layout == "batch" else None)
            if layout == "other":
                problem = problem or f"takes a tensor of shape {list(x.shape)} whose first dim {_NOT_B}"
        for i, o in enumerate(outs):
            if not isinstance(o, torch.Tensor) or not o.requires_grad:
                continue
            layout = _layout(o, ref_out[i] if ref_out else None, self.index)
            if layout == "other":
                problem = problem or f"returns a tensor of shape {list(o.shape)} whose first dim {_NOT_B}"
            elif layout == "shared" and not (o.dim() > 0 and o.shape[0] == 1):
                problem = problem or (f"returns a tensor of shape {list(o.shape)} computed from its "
                                      "parameters alone, shared by the batch without a batch dimension")
        self.records.setdefault(name, []).append(_CallRecord(problem, dims))


def probeable(args: tuple, kwargs: dict) -> bool:
    """Only plain tensors and scalars: a cache object would be advanced by a second forward."""
    return all(isinstance(x, _PLAIN) for x in tree_flatten((args, kwargs))[0])


class _NoDropout(TorchFunctionMode):
    """Dropout as in eval mode (the identity), the model otherwise in its own mode: the two probe
    batches must be comparable, and some models take other paths in train mode."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _DROPOUTS:
            return args[0] if args else kwargs["input"]
        if func is F.scaled_dot_product_attention:  # (q, k, v, attn_mask, dropout_p, ...)
            args, kwargs = args[:4] + (0.0,) * (len(args) > 4) + args[5:], {**kwargs, "dropout_p": 0.0}
        elif func is F.multi_head_attention_forward:  # its `training` only switches its dropout
            kwargs = {**kwargs, "training": False}
        return func(*args, **kwargs)


_DROPOUTS = {F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout,
             torch.dropout, torch.alpha_dropout, torch.feature_dropout, torch.feature_alpha_dropout}


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


def _second_batch(args: tuple, kwargs: dict, batch_size: int) -> tuple[tuple, dict, torch.Tensor | None]:
    """The same examples, reversed, the last one twice (B+1: never one example, whose batch
    dimension some code squeezes; every example kept, so the padded length is the same)."""
    if batch_size < 2:
        return args, kwargs, None
    index = torch.tensor([*range(batch_size - 1, -1, -1), batch_size - 1])
    flat, spec = tree_flatten((args, kwargs))
    flat = [x[index.to(x.device)] if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == batch_size
            else x for x in flat]
    args2, kwargs2 = tree_unflatten(flat, spec)
    return args2, kwargs2, index


def probe(model: nn.Module, args: tuple, kwargs: dict, batch_size: int,
          covered: dict[str, list[int]], owners: dict) -> Plan:
    """Two forwards with hooks suspended; ``covered``: hooked module name -> its parameter ids,
    ``owners``: as for ``UseChecker``.  The model's own inputs are batch-first (its contract)."""
    for name, m in model.named_modules():  # its own reason, before the probe finds mixed rows
        why = refusal(m) if any(p.requires_grad for p in m.parameters()) else None
        if why:
            raise UnsupportedModuleError(f"{module_label(model, name, m)}: {why}")
    args2, kwargs2, index = _second_batch(args, kwargs, batch_size)
    with _no_side_effects(model):
        reference: dict[str, list[tuple[Leaves, Leaves]]] = {}
        start = torch.random.get_rng_state()  # both runs draw the same layer-drop numbers
        if index is not None:
            recorder = _Recorder(model)
            try:
                with torch.no_grad(), _NoDropout():
                    model(*args2, **kwargs2)
            finally:
                recorder.remove_hooks()
            reference = recorder.calls
        torch.random.set_rng_state(start)
        tracker = _Tracker(model, owners, reference, index)
        calls = _Calls(model)
        try:
            with tracker, _NoDropout():
                model(*args, **kwargs)
        finally:
            tracker.remove_hooks()
            calls.remove_hooks()
    plan = _decide(model, tracker, covered)
    plan.calls = calls.calls
    return plan


def calls_of(model: nn.Module, args: tuple, kwargs: dict) -> list[tuple]:
    """The module calls of one forward of the batch, run as ``probe`` runs its batch (hooks
    suspended, autograd on, dropout off, no side effects), for ``Plan.calls`` to compare with."""
    with _no_side_effects(model):
        calls = _Calls(model)
        try:
            with _NoDropout():
                model(*args, **kwargs)
        finally:
            calls.remove_hooks()
    return calls.calls


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
