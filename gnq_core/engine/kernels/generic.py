"""Exact fallback for any other module: per-example vjp of that module alone.

For LayerNorm, RMSNorm (e.g. Llama's), GroupNorm and custom modules, the module's forward is
re-run per example on its captured inputs (under vmap) and pulled back through the captured
output gradients: ∇θ_j = vjp(θ ↦ f(θ, x_j))(δ_j).  One extra forward/backward of this module
only.  Its forward must be deterministic (no dropout inside) and treat examples independently.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.func import functional_call, vjp, vmap
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils._pytree import tree_flatten, tree_unflatten

from gnq_core.engine.kernels.base import Kernel, UnsupportedModuleError, dense_contributions, hooks_suspended
from gnq_core.engine.kernels.registry import generic_kernel as registry_generic
from gnq_core.engine.kernels.registry import register, register_generic

if TYPE_CHECKING:
    from gnq_core.engine.planning import Plan


def _detach(x: Any) -> Any:
    return x.detach() if isinstance(x, torch.Tensor) else x


@register_generic
class GenericKernel(Kernel):
    name = "generic-vjp"

    in_dims: list[int | None] | None = None  # per flat input leaf, from the first batch's probe

    def __init__(self) -> None:
        self._vmap_trusted: dict[type, bool] = {}  # module type -> vmap agreed with a plain vjp

    def bound(self, in_dims: list[int | None] | None, enclosing: bool = False) -> GenericKernel:
        """This kernel for one module: its inputs' batch dimensions as the probe found them
        (never guessed from shapes); ``enclosing``: it also owns its submodules' parameters."""
        kernel = copy.copy(self)  # shares _vmap_trusted
        kernel.in_dims = in_dims
        if enclosing:
            kernel.recurse, kernel.name = True, "enclosing-vjp"
        return kernel

    def capture(self, module, args, kwargs, output, batch_size):
        flat_in, in_spec = tree_flatten((args, kwargs))
        flat_out, _ = tree_flatten(output)
        diff = [i for i, o in enumerate(flat_out) if isinstance(o, torch.Tensor) and o.requires_grad]
        if self.in_dims is not None and len(self.in_dims) == len(flat_in):
            dims = self.in_dims
        else:  # no probe (check_uses=False): a leading dimension of B is taken as the batch
            dims = [0 if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == batch_size else None
                    for t in flat_in]
        return {"inputs": [_detach(t) for t in flat_in], "spec": in_spec, "diff": diff,
                "batch": batch_size, "dims": dims}

    def per_example_grads(self, module: nn.Module, saved: dict, grads, params) -> dict:
        B, spec, diff = saved["batch"], saved["spec"], saved["diff"]
        inputs, dims = saved["inputs"], saved["dims"]
        theta = {n: module.get_parameter(n).detach() for n in params}

        def one(inputs_j, grads_j, func: bool = True):
            leaves = [t.unsqueeze(0) if d == 0 else t for t, d in zip(inputs_j, dims, strict=True)]
            args, kwargs = tree_unflatten(leaves, spec)

            def f(p):
                flat_out, _ = tree_flatten(functional_call(module, p, args, kwargs))
                return tuple(flat_out[i] for i in diff)

            cotangents = tuple(gj.unsqueeze(0) for gj in grads_j)
            if func:
                _, pull = vjp(f, theta)
                (g,) = pull(cotangents)
                return g
            # plain autograd: for autograd.Functions torch.func cannot transform (RecurrentGemma)
            leaves_p = {n: t.clone().requires_grad_() for n, t in theta.items()}
            with torch.enable_grad():
                got = torch.autograd.grad(f(leaves_p), list(leaves_p.values()), cotangents,
                                          allow_unused=True)
            return {n: torch.zeros_like(t) if g is None else g
                    for (n, t), g in zip(leaves_p.items(), got, strict=True)}

        grads = tuple(grads)

        def loop():  # ops without a batching rule: same computation, one example at a time
            def run(func: bool):
                per = [one([t[j] if d == 0 else t for t, d in zip(inputs, dims, strict=True)],
                           tuple(g[j] for g in grads), func) for j in range(B)]
                return {n: torch.stack([p[n] for p in per]) for n in params}
            try:
                return run(func=True)
            except RuntimeError:
                pass
            try:
                return run(func=False)
            except RuntimeError as err:
                raise UnsupportedModuleError(
                    "re-running its forward for one example at a time "
                    f"failed ({str(err).splitlines()[0][:160]}); it keeps state between calls or "
                    "mixes the examples, so its per-example gradients cannot be recomputed") from err

        with hooks_suspended():
            if self._vmap_trusted.get(type(module)) is False:
                return loop()
            try:
                batched = vmap(one, in_dims=(dims, 0), randomness="error")(inputs, grads)
            except RuntimeError as err:
                if "random" in str(err).lower():
                    raise UnsupportedModuleError(
                        f"{type(module).__name__} draws random numbers in its forward (dropout "
                        "inside a module with its own parameters); its per-example gradients "
                        "cannot be recomputed exactly"
                    ) from err
                return loop()
            if type(module) not in self._vmap_trusted:
                self._vmap_trusted[type(module)] = self._agrees(batched, one, inputs, dims, grads)
                if not self._vmap_trusted[type(module)]:
                    return loop()
            return batched

    @staticmethod
    def _agrees(batched: dict, one, inputs: list, dims: list, grads: tuple) -> bool:
        """vmap's first row against the same vjp run without vmap.  Some batching rules are
        wrong (torch 2.13: an expanded parameter concatenated to batched scores, FLINT's
        attention sinks, came out doubled), so a module type is trusted only after this check."""
        first = one([t[0] if d == 0 else t for t, d in zip(inputs, dims, strict=True)],
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


def planned_kernel(name: str, kernel: Kernel, plan: Plan | None) -> Kernel:
    """The kernel the first batch's plan gives module ``name`` (``kernel``: its registered one)."""
    if plan is None:
        return kernel
    if name in plan.enclose:
        base = kernel if isinstance(kernel, GenericKernel) else registry_generic()
        return base.bound(plan.in_dims.get(name), enclosing=True)
    if isinstance(kernel, GenericKernel):
        return kernel.bound(plan.in_dims.get(name))
    return kernel


@register(nn.MultiheadAttention)
class MultiheadAttentionKernel(GenericKernel):
    """MHA uses its out_proj's weights directly, so it owns all of its parameters."""

    name = "generic-vjp"
    recurse = True


@register(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
class BatchNormKernel(GenericKernel):
    """Eval-mode BatchNorm is per-example; batch statistics couple the examples of a batch."""

    def capture(self, module, args, kwargs, output, batch_size):
        assert isinstance(module, _BatchNorm)
        if module.training or not module.track_running_stats:
            raise UnsupportedModuleError(
                f"{type(module).__name__} normalises with batch statistics in train mode, which "
                "couples the examples of a batch, so per-example gradients (and GNQ) are not "
                "defined; put it in eval mode (module.eval()) or replace it with GroupNorm/LayerNorm"
            )
        return super().capture(module, args, kwargs, output, batch_size)
