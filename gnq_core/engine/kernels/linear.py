"""nn.Linear (y = x Wᵀ + b) and Hugging Face Conv1D (y = x W + b, GPT-2's blocks).

Per example j with positions t: ∇W = Δ_jᵀ X_j (Linear) or X_jᵀ Δ_j (Conv1D), ∇b = Σ_t Δ_jt.
Any leading shape [B, ...] is flattened to [B, T, d], so the Gram covers every position pair.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from gnq_core.engine.kernels.base import Contribution, Kernel, batch_first, first_input
from gnq_core.engine.kernels.fused import FusedLinearFunction
from gnq_core.engine.kernels.registry import register
from gnq_core.engine.math.cost_model import fused_is_cheaper
from gnq_core.engine.math.representations import DenseFactor, OuterRep, as_sequence

try:  # transformers is a dependency, but keep the engine importable without it
    from transformers.pytorch_utils import Conv1D as HFConv1D
except ImportError:  # pragma: no cover
    HFConv1D = None


def linear_contributions(
    x: torch.Tensor,
    delta: torch.Tensor,
    params: Sequence[str],
    split: frozenset[str],
    weight_is_in_out: bool,
) -> list[Contribution]:
    """Contributions of a layer y = x·W(+b); ``weight_is_in_out`` for W stored [d_in, d_out]."""
    B = x.shape[0]
    X = DenseFactor(as_sequence(x, B))
    D = DenseFactor(as_sequence(delta, B))
    has_w, has_b = "weight" in params, "bias" in params
    no_input = DenseFactor(X.values[..., :0])  # width-0 factor: with bias=True, C = [1] gives ∇b
    if has_w and has_b and not split:
        return [Contribution(("weight", "bias"), OuterRep(D, X, bias=True))]
    out = []
    if has_w:
        w_rep = OuterRep(X, D) if weight_is_in_out else OuterRep(D, X)
        out.append(Contribution(("weight",), w_rep))
    if has_b:
        out.append(Contribution(("bias",), OuterRep(D, no_input, bias=True)))
    return out


@register(nn.Linear)
class LinearKernel(Kernel):
    name = "linear"
    weight_is_in_out = False
    input_name = "input"
    fusable = True

    def capture(self, module, args, kwargs, output, batch_size):
        return batch_first(first_input(args, kwargs, self.input_name).detach(), batch_size)

    def fused_forward(self, module, args, kwargs, request):
        """Fuse where materialising G is cheaper than the ghost Gram (the cost model), and for a
        weight already used in this pass only behind embedding lookups (a tied head)."""
        if "weight" not in request.params or request.shared_beyond_lookups or request.path == "ghost":
            return NotImplemented
        x = first_input(args, kwargs, self.input_name)
        B = request.batch_size
        if x.dim() < 2 or x.shape[0] != B:
            return NotImplemented
        rows, cols = module.weight.shape
        T = x.numel() // max(B * x.shape[-1], 1)
        if request.path != "materialize" and not fused_is_cheaper(B, T, rows, cols):
            return NotImplemented
        return FusedLinearFunction.apply(x, module.weight, module.bias, self.weight_is_in_out,
                                         request.open_sink(), request.memory_budget)

    def contributions(self, module, saved, grads, params, split):
        if grads[0] is None:  # the output did not reach the loss: zero gradient
            return []
        return linear_contributions(saved, grads[0], params, split, self.weight_is_in_out)


if HFConv1D is not None:

    @register(HFConv1D)
    class Conv1DKernel(LinearKernel):
        """GPT-2's Conv1D: a Linear layer with its weight stored as [d_in, d_out]."""

        name = "hf-conv1d"
        weight_is_in_out = True
        input_name = "x"
