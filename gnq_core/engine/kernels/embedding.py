"""nn.Embedding (token and position embeddings): ∇E_j = Σ_t e_{tok_jt} δ_jtᵀ.

Ghost Gram: blocksum([tok = tok'] ⊙ ΔΔᵀ).  Rows at ``padding_idx`` get no gradient, so their
Δ is zeroed.  Position embeddings whose ids are [1, T] are broadcast over the batch; the
auditor expands their output so each example's own Δ is seen.
"""

from __future__ import annotations

from torch import nn

from gnq_core.engine.kernels.base import (
    Contribution,
    Kernel,
    UnsupportedModuleError,
    batch_first,
    first_input,
)
from gnq_core.engine.kernels.registry import register
from gnq_core.engine.math.representations import DenseFactor, OneHotFactor, OuterRep


@register(nn.Embedding)
class EmbeddingKernel(Kernel):
    name = "embedding"
    row_lookup = True

    def rows_touched(self, saved):
        return saved.reshape(-1)  # the looked-up token ids

    def capture(self, module, args, kwargs, output, batch_size):
        if module.scale_grad_by_freq:
            raise UnsupportedModuleError(
                "Embedding with scale_grad_by_freq=True divides each gradient by token counts "
                "over the whole batch, so per-example gradients are not defined"
            )
        tokens = batch_first(first_input(args, kwargs), batch_size)
        return tokens.reshape(batch_size, -1)

    def contributions(self, module, saved, grads, params, split):
        delta = grads[0]
        if delta is None or "weight" not in params:
            return []
        tokens = saved
        delta = delta.reshape(tokens.shape[0], tokens.shape[1], -1)
        if module.padding_idx is not None:
            delta = delta.masked_fill((tokens == module.padding_idx).unsqueeze(-1), 0)
        rep = OuterRep(OneHotFactor(tokens, module.num_embeddings), DenseFactor(delta))
        return [Contribution(("weight",), rep)]
