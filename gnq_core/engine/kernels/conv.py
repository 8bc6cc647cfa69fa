"""nn.Conv1d / nn.Conv2d via unfold (im2col): a Linear layer over output positions, per group.

Unfolded patches P_j ∈ R^{L×(C_in/g·k)} and output gradients Δ_j ∈ R^{L×C_out} give
∇W_j = Δ_jᵀ P_j for each group; stride, padding (incl. 'same' and non-zero modes),
dilation and groups are honoured exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gnq_core.engine.kernels.base import Contribution, Kernel, batch_first, first_input
from gnq_core.engine.kernels.linear import linear_contributions
from gnq_core.engine.kernels.registry import register
from gnq_core.engine.math.representations import DenseRep


def _unfold(module: nn.Conv1d | nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """[B, C_in·k, L] patches exactly as the convolution saw them."""
    two_d = isinstance(module, nn.Conv2d)
    padding = module.padding
    if isinstance(padding, str) or module.padding_mode != "zeros":
        mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
        x = F.pad(x, module._reversed_padding_repeated_twice, mode=mode)
        padding = (0, 0) if two_d else (0,)
    if two_d:
        return F.unfold(x, module.kernel_size, dilation=module.dilation, padding=padding,
                        stride=module.stride)
    # Conv1d is a Conv2d of height 1
    return F.unfold(x.unsqueeze(2), (1, module.kernel_size[0]), dilation=(1, module.dilation[0]),
                    padding=(0, padding[0]), stride=(1, module.stride[0]))


@register(nn.Conv1d, nn.Conv2d)
class ConvKernel(Kernel):
    name = "conv-unfold"

    def capture(self, module, args, kwargs, output, batch_size):
        x = first_input(args, kwargs).detach()
        if x.dim() == module.weight.dim() - 1:
            raise ValueError(f"{type(module).__name__} got an unbatched input")
        return batch_first(x, batch_size)

    def contributions(self, module, saved, grads, params, split):
        delta = grads[0]
        if delta is None:
            return []
        B, g = saved.shape[0], module.groups
        patches = _unfold(module, saved).transpose(1, 2)  # [B, L, C_in·k]
        delta = delta.reshape(B, module.out_channels, -1).transpose(1, 2)  # [B, L, C_out]
        in_per, out_per = patches.shape[-1] // g, module.out_channels // g
        parts = []
        for i in range(g):
            p_i = patches[..., i * in_per:(i + 1) * in_per]
            d_i = delta[..., i * out_per:(i + 1) * out_per]
            parts.append(linear_contributions(p_i, d_i, params, split, weight_is_in_out=False))
        if g == 1 or not split:  # groups touch disjoint weight blocks: their Grams add up
            return [c for part in parts for c in part]
        # a shared grouped weight: assemble whole-parameter gradients in its own layout
        merged = []
        for k, names in enumerate(parts[0]):
            blocks = [part[k].rep.materialize().reshape(B, out_per, -1) for part in parts]
            merged.append(Contribution(names.params, DenseRep(torch.cat(blocks, 1).reshape(B, -1))))
        return merged

