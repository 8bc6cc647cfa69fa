"""nn.LayerNorm and Llama's RMSNorm: per-example gradients in closed form, no per-example re-run.

y = x̂ ⊙ w + b with x̂ = (x − μ) / sqrt(σ² + ε) over the normalised dims, so
∇w_j = Σ_t Δ_jt ⊙ x̂_jt and ∇b_j = Σ_t Δ_jt: B·T·d work instead of the generic vmap'd vjp.
"""

from __future__ import annotations

import torch
from torch import nn

from gnq_core.engine.kernels.base import (
    Contribution,
    Kernel,
    UnsupportedModuleError,
    batch_first,
    dense_contributions,
    first_input,
)
from gnq_core.engine.kernels.deferred import NormRecord, NormRep
from gnq_core.engine.kernels.fused import FusedLayerNormFunction
from gnq_core.engine.kernels.registry import register
from gnq_core.engine.math.representations import compute_dtype


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
        mean = x.mean(dim=-1, keepdim=True)
        rstd = torch.rsqrt(x.var(dim=-1, unbiased=False, keepdim=True) + module.eps)
        record = NormRecord.layer_norm(x, d, mean, rstd, width, "weight" in params, "bias" in params)
        per_w, per_b = record.per_example()  # the closed form the fused path defers
        given = {n: g for n, g in (("weight", per_w), ("bias", per_b)) if g is not None}
        return dense_contributions(given, split)

    def fused_forward(self, module, args, kwargs, request):
        """Per-example LayerNorm gradients are B×d: always formed, reusing the forward's statistics."""
        x = first_input(args, kwargs)
        if torch.is_autocast_enabled(x.device.type):  # autocast picks LayerNorm's dtype: its own path
            return NotImplemented
        if x.dim() < 2 or x.shape[0] != request.batch_size or not request.params:
            return NotImplemented
        return FusedLayerNormFunction.apply(x, module.weight, module.bias, module.normalized_shape,
                                            module.eps, request.open_sink())


try:  # transformers is a dependency, but keep the engine importable without it
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
except ImportError:  # pragma: no cover
    LlamaRMSNorm = None


if LlamaRMSNorm is not None:
    _LLAMA_RMS_FORWARD = LlamaRMSNorm.forward  # the closed form below is this forward's

    @register(LlamaRMSNorm)
    class LlamaRMSNormKernel(Kernel):
        """Llama's RMSNorm, y = w ⊙ (x·rsqrt(mean(x²) + ε) in float32, cast back): ∇w_j =
        Σ_t Δ_jt ⊙ x̂_jt in closed form, formed for all layers of one shape at once at
        ``compute()`` (``gnq_core.engine.kernels.deferred``) instead of a per-example vjp per layer."""

        name = "rmsnorm"

        def capture(self, module, args, kwargs, output, batch_size):
            if type(module).forward is not _LLAMA_RMS_FORWARD or "forward" in vars(module):
                raise UnsupportedModuleError("its forward was replaced (a hub kernel?), so the closed "
                                             "form of Llama's RMSNorm may not be what it computes")
            return batch_first(first_input(args, kwargs, "hidden_states").detach(), batch_size)

        def contributions(self, module, saved, grads, params, split):
            if grads[0] is None or "weight" not in params:
                return []
            record = NormRecord.rms_norm(saved, grads[0], module.variance_epsilon)
            if split:  # the weight is used elsewhere too: its gradients stand alone, now
                return dense_contributions({"weight": record.per_example()[0]}, split)
            return [Contribution(("weight",), NormRep(record))]
