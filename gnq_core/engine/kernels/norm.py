"""nn.LayerNorm: per-example gradients in closed form, no per-example re-run.

y = x̂ ⊙ w + b with x̂ = (x − μ) / sqrt(σ² + ε) over the normalised dims, so
∇w_j = Σ_t Δ_jt ⊙ x̂_jt and ∇b_j = Σ_t Δ_jt: B·T·d work instead of the generic vmap'd vjp.
"""

from __future__ import annotations

import torch
from torch import nn

from gnq_core.engine.fused import FusedLayerNormFunction
from gnq_core.engine.kernels.base import Kernel, batch_first, dense_contributions, first_input
from gnq_core.engine.kernels.registry import register
from gnq_core.engine.representations import compute_dtype


@register(nn.LayerNorm)
class LayerNormKernel(Kernel):
    name = "layernorm"
    fusable = True

    def capture(self, module, args, kwargs, output, batch_size):
        return batch_first(first_input(args, kwargs).detach(), batch_size)

    def contributions(self, module, saved, grads, params, split):
        delta = grads[0]
        if delta is None:
            return []
        B, width = saved.shape[0], module.weight.numel() if module.weight is not None else 0
        width = width or int(torch.tensor(module.normalized_shape).prod())
        dtype = compute_dtype(delta)
        x = saved.reshape(B, -1, width).to(dtype)
        d = delta.reshape(B, -1, width).to(dtype)
        per_example = {}
        if "weight" in params:
            mean = x.mean(dim=-1, keepdim=True)
            var = x.var(dim=-1, unbiased=False, keepdim=True)
            x_hat = (x - mean) * torch.rsqrt(var + module.eps)
            per_example["weight"] = (d * x_hat).sum(dim=1)
        if "bias" in params:
            per_example["bias"] = d.sum(dim=1)
        return dense_contributions(per_example, split)

    def fused_forward(self, module, args, kwargs, request):
        """Per-example LayerNorm gradients are B×d: always formed, reusing the forward's statistics."""
        x = first_input(args, kwargs)
        if torch.is_autocast_enabled(x.device.type):  # autocast picks LayerNorm's dtype: its own path
            return NotImplemented
        if x.dim() < 2 or x.shape[0] != request.batch_size or not request.params:
            return NotImplemented
        return FusedLayerNormFunction.apply(x, module.weight, module.bias, module.normalized_shape,
                                            module.eps, request.open_sink())
