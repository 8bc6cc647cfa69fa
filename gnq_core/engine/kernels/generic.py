"""Exact fallback for any other module: per-example vjp of that module alone.

For LayerNorm, RMSNorm (e.g. Llama's), GroupNorm and custom modules, the module's forward is
re-run per example on its captured inputs (under vmap) and pulled back through the captured
output gradients: ∇θ_j = vjp(θ ↦ f(θ, x_j))(δ_j).  One extra forward/backward of this module
only.  The re-run shares no mutable state with the batch's forward: a cache object among the
inputs (transformers' DynamicCache, a Mamba state...) is replaced by None, and the re-run's
outputs must reproduce the batch's, or the module is refused in one line.  A module that drew
random numbers in the batch's forward (dropout in train mode) is re-run on the whole batch from
the random-number state its call started with, so it draws the very same masks, and example j's
gradient is the pullback of a cotangent that is δ_j on example j's rows and 0 elsewhere.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vjp, vmap
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils._pytree import tree_flatten, tree_unflatten

from gnq_core.engine.kernels.base import Kernel, UnsupportedModuleError, dense_contributions, hooks_suspended
from gnq_core.engine.kernels.registry import register, register_generic

# how far a re-run's output may be from the batch's (one example alone rounds differently)
_REPRODUCE_TOL = {torch.float64: 1e-7, torch.float32: 1e-3}


def _detach(x: Any) -> Any:
    return x.detach() if isinstance(x, torch.Tensor) else x


def _holds_tensors(x: Any, depth: int = 4, seen: set[int] | None = None) -> bool:
    """Mutable state among a call's inputs: an object (not a module) with tensors inside."""
    seen = set() if seen is None else seen
    if isinstance(x, torch.Tensor):
        return True
    if depth == 0 or id(x) in seen or isinstance(x, nn.Module | str | bytes | int | float | bool | None):
        return False
    seen.add(id(x))
    if isinstance(x, dict):
        items = list(x.values())
    elif isinstance(x, list | tuple | set):
        items = list(x)
    elif hasattr(x, "__dict__") and not callable(x):
        items = list(vars(x).values())
    else:
        return False
    return any(_holds_tensors(v, depth - 1, seen) for v in items)


def _rng_state(module: nn.Module) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    devices = {p.device.index or 0 for p in module.parameters() if p.device.type == "cuda"}
    return torch.random.get_rng_state(), {d: torch.cuda.get_rng_state(d) for d in sorted(devices)}


def _same_rng(a: tuple, b: tuple) -> bool:
    return torch.equal(a[0], b[0]) and a[1].keys() == b[1].keys() and all(
        torch.equal(a[1][d], b[1][d]) for d in a[1])


def _reproduces(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Whether the re-run's output is the batch's, as a 0-d bool tensor (read with the step's
    one device-to-host read, in ``compute()``)."""
    tol = _REPRODUCE_TOL.get(want.dtype, 5e-2)
    got, want = got.detach(), want.detach()
    if not want.numel():
        return torch.ones((), dtype=torch.bool, device=want.device)
    scale = want.abs().nan_to_num(0, 0, 0).amax()
    close = (got - want).abs() <= tol * (scale + want.abs())
    return (close | (got == want) | (got.isnan() & want.isnan())).all()


def _autograd_vjp(f: Callable, theta: dict[str, torch.Tensor]) -> tuple[tuple, Callable]:
    """``torch.func.vjp(f, theta)`` by plain autograd, for autograd.Functions torch.func cannot
    transform (RecurrentGemma): the outputs (detached) and their pullback to ``theta`` (zeros
    for a parameter they do not use; ``retain``: the graph stays for another pullback)."""
    leaves = {n: t.clone().requires_grad_() for n, t in theta.items()}
    with torch.enable_grad():
        outs = f(leaves)

    def pull(cotangents: tuple, retain: bool = False) -> tuple[dict[str, torch.Tensor]]:
        got = torch.autograd.grad(outs, list(leaves.values()), cotangents, retain_graph=retain,
                                  allow_unused=True)
        return ({n: torch.zeros_like(t) if g is None else g
                 for (n, t), g in zip(leaves.items(), got, strict=True)},)

    return tuple(o.detach() for o in outs), pull


@register_generic
class GenericKernel(Kernel):
    name = "generic-vjp"

    in_dims: list[int | None] | None = None  # per flat input leaf, from the first batch's probe
    planned = False  # True: bound by a probe's plan (in_dims proven, never guessed)

    def __init__(self) -> None:
        self._vmap_trusted: dict[type, bool] = {}  # module type -> vmap agreed with a plain vjp
        self._rng_before: tuple | None = None
        self._check: tuple[torch.Tensor, str] | None = None

    def bound(self, in_dims: list[int | None] | None, enclosing: bool = False) -> GenericKernel:
        """This kernel for one module: its inputs' batch dimensions as the probe found them
        (never guessed from shapes); ``enclosing``: it also owns its submodules' parameters."""
        kernel = copy.copy(self)  # shares _vmap_trusted
        kernel.in_dims, kernel.planned, kernel._rng_before, kernel._check = in_dims, True, None, None
        if enclosing:
            kernel.recurse, kernel.name = True, "enclosing-vjp"
        return kernel

    def before(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """Forward pre-hook: the random-number state this call starts from (train mode only)."""
        self._rng_before = _rng_state(module) if any(m.training for m in module.modules()) else None

    def capture(self, module, args, kwargs, output, batch_size):
        rng, self._rng_before = self._rng_before, None
        random = rng is not None and not _same_rng(rng, _rng_state(module))
        flat_in, in_spec = tree_flatten((args, kwargs))
        flat_out, _ = tree_flatten(output)
        diff = [i for i, o in enumerate(flat_out) if isinstance(o, torch.Tensor) and o.requires_grad]
        if self.in_dims is not None and len(self.in_dims) == len(flat_in):
            dims = self.in_dims
        elif self.planned:
            raise UnsupportedModuleError(
                f"this call has {len(flat_in)} inputs where the first batch's had "
                f"{len(self.in_dims or [])}, so which of them carry the batch is not known")
        else:  # check_uses=False: the caller vouched for batch-first inputs
            dims = [0 if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == batch_size else None
                    for t in flat_in]
        state = [type(t).__name__ for t in flat_in if not isinstance(t, torch.Tensor) and _holds_tensors(t)]
        inputs = [None if not isinstance(t, torch.Tensor) and _holds_tensors(t) else _detach(t)
                  for t in flat_in]
        # the batch's outputs, to check the re-run against: copied where the re-run is not the
        # plain one (a replaced cache, a replayed dropout), else kept unless the model later
        # writes to them in place (Falcon adds the attention output to its MLP's)
        copy_out = bool(state) or random
        outputs = [flat_out[i].detach().clone() if copy_out else flat_out[i].detach() for i in diff]
        return {"inputs": inputs, "spec": in_spec, "diff": diff, "batch": batch_size, "dims": dims,
                "outputs": outputs, "versions": [o._version for o in outputs], "state": state,
                "rng": rng if random else None}

    def _unreproduced(self, saved: dict, detail: str) -> str:
        why = (f"it reads the {', '.join(sorted(set(saved['state'])))} the batch's forward had already "
               "written to" if saved["state"] else "it keeps state between calls or mixes the examples")
        return (f"re-running its forward {detail} does not reproduce the batch's output; {why}, so its "
                "per-example gradients cannot be recomputed")

    def _check_outputs(self, saved: dict, outs: tuple, per_example: bool) -> None:
        """The re-run computed the batch's outputs (per example: stacked [B, 1, ...]).  A shape
        that differs refuses now; the values are checked with the step's one read (``take_check``)."""
        B = saved["batch"]
        detail = "for one example at a time" if per_example else "from its call's random-number state"
        for got, want, version in zip(outs, saved["outputs"], saved["versions"], strict=True):
            if want._version != version:  # written to in place since: nothing left to compare with
                continue
            if per_example:
                want = want.unsqueeze(1) if want.shape[0] == B else want.unsqueeze(0).expand(B, *want.shape)
            if got.shape != want.shape:
                raise UnsupportedModuleError(self._unreproduced(saved, detail))
            ok = _reproduces(got, want)
            self._check = (ok, self._unreproduced(saved, detail)) if self._check is None else (
                self._check[0] & ok, self._check[1])

    def take_check(self) -> tuple[torch.Tensor, str] | None:
        """(all re-runs since the last call reproduced the batch's outputs, why not): read by
        the auditor's ``compute()`` with its one device-to-host read."""
        check, self._check = self._check, None
        return check

    def per_example_grads(self, module: nn.Module, saved: dict, grads, params) -> dict:
        if saved["rng"] is not None:
            return self._replayed(module, saved, tuple(grads), params)
        B, spec, diff = saved["batch"], saved["spec"], saved["diff"]
        inputs, dims = saved["inputs"], saved["dims"]
        theta = {n: module.get_parameter(n).detach() for n in params}

        def one(inputs_j, grads_j, func: bool = True):
            leaves = [t.unsqueeze(0) if d == 0 else t for t, d in zip(inputs_j, dims, strict=True)]
            args, kwargs = tree_unflatten(leaves, spec)

            def f(p):
                flat_out, _ = tree_flatten(functional_call(module, p, args, kwargs))
                return tuple(flat_out[i] for i in diff)

            outs, pull = vjp(f, theta) if func else _autograd_vjp(f, theta)
            (g,) = pull(tuple(gj.unsqueeze(0) for gj in grads_j))
            return g, outs

        grads = tuple(grads)

        def loop():  # ops without a batching rule: same computation, one example at a time
            def run(func: bool):
                per = [one([t[j] if d == 0 else t for t, d in zip(inputs, dims, strict=True)],
                           tuple(g[j] for g in grads), func) for j in range(B)]
                outs = tuple(torch.stack([o[k] for _, o in per]) for k in range(len(diff)))
                return {n: torch.stack([p[n] for p, _ in per]) for n in params}, outs
            try:
                return run(func=True)
            except (RuntimeError, AttributeError, TypeError, ValueError):
                pass
            try:
                return run(func=False)
            except (RuntimeError, AttributeError, TypeError, ValueError) as err:
                state = saved["state"]
                why = (f"it needs the {', '.join(sorted(set(state)))} the batch's forward had written to, "
                       "which the re-run cannot share" if state else
                       "it keeps state between calls or mixes the examples")
                raise UnsupportedModuleError(
                    "re-running its forward for one example at a time "
                    f"failed ({str(err).splitlines()[0][:160]}); {why}, so its per-example gradients "
                    "cannot be recomputed") from err

        with hooks_suspended():
            if self._vmap_trusted.get(type(module)) is False:
                batched, outs = loop()
            else:
                try:
                    batched, outs = vmap(one, in_dims=(dims, 0), randomness="error")(inputs, grads)
                except (RuntimeError, AttributeError, TypeError, ValueError):  # no batching rule, a
                    batched, outs = loop()  # random op that drew nothing, a cache it needs...
                else:
                    if type(module) not in self._vmap_trusted:
                        self._vmap_trusted[type(module)] = self._agrees(batched, one, inputs, dims, grads)
                        if not self._vmap_trusted[type(module)]:
                            batched, outs = loop()
        self._check_outputs(saved, outs, per_example=True)
        return batched

    def _replayed(self, module: nn.Module, saved: dict, grads: tuple, params) -> dict:
        """The whole batch re-run from its call's random-number state (the same dropout masks),
        one pullback per example: cotangent δ_j on example j's rows, 0 on the others'."""
        B, diff, (cpu, cuda) = saved["batch"], saved["diff"], saved["rng"]
        args, kwargs = tree_unflatten(saved["inputs"], saved["spec"])
        theta = {n: module.get_parameter(n).detach() for n in params}
        eye = None
        cots = []
        for g, out in zip(grads, saved["outputs"], strict=True):
            if out.shape[0] == B:  # [B, B, ...]: row j of example j's cotangent is δ_j
                eye = torch.eye(B, dtype=g.dtype, device=g.device) if eye is None else eye.to(g.dtype)
                cots.append(eye.view(B, B, *[1] * (g.dim() - 1)) * g.unsqueeze(0))
            else:  # a shared output [1, ...], expanded to the batch by the hook
                cots.append(g.unsqueeze(1))

        def f(p):
            with torch.random.fork_rng(devices=sorted(cuda)):
                torch.random.set_rng_state(cpu)
                for d, state in cuda.items():
                    torch.cuda.set_rng_state(state, d)
                flat_out, _ = tree_flatten(functional_call(module, p, args, kwargs))
            return tuple(flat_out[i] for i in diff)

        with hooks_suspended():
            try:
                outs, pull = vjp(f, theta)
                self._check_outputs(saved, outs, per_example=False)
                try:
                    (per,) = vmap(pull)(tuple(cots))
                except RuntimeError:
                    per = [pull(tuple(c[j] for c in cots))[0] for j in range(B)]
                    per = {n: torch.stack([q[n] for q in per]) for n in params}
                return per
            except UnsupportedModuleError:
                raise
            except RuntimeError:  # autograd.Functions torch.func cannot transform
                pass
            outs, pull = _autograd_vjp(f, theta)
            self._check_outputs(saved, outs, per_example=False)
            rows = [pull(tuple(c[j] for c in cots), retain=j < B - 1)[0] for j in range(B)]
            return {n: torch.stack([r[n] for r in rows]) for n in theta}

    @staticmethod
    def _agrees(batched: dict, one, inputs: list, dims: list, grads: tuple) -> bool:
        """vmap's first row against the same vjp run without vmap.  Some batching rules are
        wrong (torch 2.13: an expanded parameter concatenated to batched scores, FLINT's
        attention sinks, came out doubled), so a module type is trusted only after this check."""
        first, _ = one([t[0] if d == 0 else t for t, d in zip(inputs, dims, strict=True)],
                       tuple(g[0] for g in grads))
        return all(torch.allclose(batched[n][0], first[n], rtol=1e-6, atol=0) or
                   torch.equal(batched[n][0], first[n]) for n in first)

    def contributions(self, module, saved, grads, params, split):
        per_example = self.per_example_grads(module, saved, grads, params)
        # an enclosing module's replay (one example alone) went non-finite where the batch did
        # not (Longformer's padded windows): refuse rather than report a NaN batch
        if (self.recurse and not all(bool(torch.isfinite(g).all()) for g in per_example.values())
                and all(bool(torch.isfinite(g).all()) for g in grads if g is not None)):
            raise UnsupportedModuleError(
                "re-running its forward for one example at a time gave non-finite gradients where "
                "the batch's are finite")
        return dense_contributions(per_example, split)


@register(nn.MultiheadAttention)
class MultiheadAttentionKernel(GenericKernel):
    """MHA uses its out_proj's weights directly, so it owns all of its parameters."""

    name = "generic-vjp"
    recurse = True


@register(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
class BatchNormKernel(GenericKernel):
    """Eval-mode BatchNorm is per-example; batch statistics couple the examples of a batch."""

    @staticmethod
    def refusal(module: nn.Module) -> str | None:
        """Why this (BatchNorm) module's per-example gradients are not defined, if they are not."""
        if isinstance(module, _BatchNorm) and (module.training or not module.track_running_stats):
            return (f"{type(module).__name__} normalises with batch statistics in train mode, which "
                    "couples the examples of a batch, so per-example gradients (and GNQ) are not "
                    "defined; put it in eval mode (module.eval()) or replace it with GroupNorm/LayerNorm")
        return None

    def capture(self, module, args, kwargs, output, batch_size):
        why = self.refusal(module)
        if why:
            raise UnsupportedModuleError(why)
        return super().capture(module, args, kwargs, output, batch_size)
