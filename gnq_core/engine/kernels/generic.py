"""Exact fallback for any other module: per-example vjp of that module alone.

For LayerNorm, RMSNorm (e.g. Llama's), GroupNorm and custom modules, the module's forward is
re-run per example on its captured inputs (under vmap) and pulled back through the captured
output gradients: ∇θ_j = vjp(θ ↦ f(θ, x_j))(δ_j).  One extra forward/backward of this module
only.  Its forward must be deterministic (no dropout inside) and treat examples independently.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vjp, vmap
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils._pytree import tree_flatten, tree_unflatten

from gnq_core.engine.kernels.base import Kernel, UnsupportedModuleError, dense_contributions, hooks_suspended
from gnq_core.engine.kernels.registry import register, register_generic


def _detach(x: Any) -> Any:
    return x.detach() if isinstance(x, torch.Tensor) else x


@register_generic
class GenericKernel(Kernel):
    name = "generic-vjp"

    def capture(self, module, args, kwargs, output, batch_size):
        flat_in, in_spec = tree_flatten((args, kwargs))
        flat_out, _ = tree_flatten(output)
        diff = [i for i, o in enumerate(flat_out) if isinstance(o, torch.Tensor) and o.requires_grad]
        return {"inputs": [_detach(t) for t in flat_in], "spec": in_spec, "diff": diff,
                "batch": batch_size}

    def per_example_grads(self, module: nn.Module, saved: dict, grads, params) -> dict:
        B, spec, diff = saved["batch"], saved["spec"], saved["diff"]
        inputs = saved["inputs"]
        dims = [0 if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == B else None
                for t in inputs]
        theta = {n: module.get_parameter(n).detach() for n in params}

        def one(inputs_j, grads_j):
            leaves = [t.unsqueeze(0) if d == 0 else t for t, d in zip(inputs_j, dims, strict=True)]
            args, kwargs = tree_unflatten(leaves, spec)

            def f(p):
                flat_out, _ = tree_flatten(functional_call(module, p, args, kwargs))
                return tuple(flat_out[i] for i in diff)

            _, pull = vjp(f, theta)
            (g,) = pull(tuple(gj.unsqueeze(0) for gj in grads_j))
            return g

        grads = tuple(grads)
        with hooks_suspended():
            try:
                return vmap(one, in_dims=(dims, 0), randomness="error")(inputs, grads)
            except RuntimeError as err:
                if "random" in str(err).lower():
                    raise UnsupportedModuleError(
                        f"{type(module).__name__} draws random numbers in its forward (dropout "
                        "inside a module with its own parameters); its per-example gradients "
                        "cannot be recomputed exactly"
                    ) from err
            # some ops have no batching rule: same computation, one example at a time
            per = [one([t[j] if d == 0 else t for t, d in zip(inputs, dims, strict=True)],
                       tuple(g[j] for g in grads)) for j in range(B)]
            return {n: torch.stack([p[n] for p in per]) for n in params}

    def contributions(self, module, saved, grads, params, split):
        return dense_contributions(self.per_example_grads(module, saved, grads, params), split)


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
