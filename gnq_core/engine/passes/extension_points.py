"""The auditor's extension points: what "the batch" is, and what K gets from each call.

The Gram blocks of K, a tied weight's rows and the final B×B kernel go through these public
methods, so a subclass can change what "the batch" is (``engine.passes.distributed``: the global batch
of all ranks; ``engine.passes.window``: the micro-batches of an update) without touching the hooks or
the bookkeeping (``engine.passes.pass_state`` forms every block of K through them).
"""

from __future__ import annotations

import torch

from gnq_core.engine.kernels import Contribution
from gnq_core.engine.math.cost_model import InnerPath
from gnq_core.engine.math.grams import inner
from gnq_core.engine.math.representations import Rep
from gnq_core.engine.math.solve import unweight_kernel
from gnq_core.engine.plan.assignment import Hooked
from gnq_core.engine.plan.batch import BatchDimensionError


class ExtensionPoints:
    """``GNQAuditor``'s overridable steps; the defaults: the batch is this process's own."""

    _path: InnerPath | None  # forced Gram path (None: the cost model picks), set by GNQAuditor
    _budget: int  # bytes for one Gram intermediate

    def on_pass_start(self, batch_size: int) -> None:
        """Called when a forward pass of ``batch_size`` examples starts being audited."""

    def on_contributions(self, h: Hooked, contributions: list[Contribution]) -> list[Contribution]:
        """A hooked call's per-example gradient representations, before their Gram blocks are
        added to K; returns those K gets (``engine.passes.window`` keeps or sketches them across the
        micro-batches of an update).  Fused calls report their Gram only and skip this."""
        return contributions

    def pair_gram(self, a: Rep, b: Rep) -> tuple[torch.Tensor, str]:
        """⟨a_j, b_k⟩ for all j, k by this auditor's path choice and memory budget, and the path."""
        return inner(a, b, self._path, self._budget)

    def gram_block(self, rep: Rep) -> tuple[torch.Tensor, str]:
        """This pass's block ⟨g_j, g_k⟩ of one representation, and the path used."""
        return self.pair_gram(rep, rep)

    def cross_block(self, a: Rep, b: Rep) -> torch.Tensor:
        """Cross terms ⟨a_j, b_k⟩ + ⟨b_j, a_k⟩ of two uses of one shared parameter."""
        cross, _ = self.pair_gram(a, b)
        return cross + cross.T

    def merge_rows(self, rows: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
        """The rows of a tied weight (on ``device``) to keep for its later lookups, from this
        process's rows (None: all rows are needed)."""
        return rows

    def batch_kernel(self, kernel: torch.Tensor | None, batch_size: int, weights: torch.Tensor | None
                     ) -> tuple[torch.Tensor, int]:
        """The finished pass's kernel for the per-example losses ℓ_j, and its batch size, from
        the accumulated Gram blocks (None: no block was added)."""
        B = batch_size
        K = kernel if kernel is not None else torch.zeros(B, B, dtype=torch.float64)
        if K.shape != (B, B):
            raise BatchDimensionError(f"kernel has shape {tuple(K.shape)} for a batch of {B}")
        if weights is not None:
            K = unweight_kernel(K, weights, validate=False)  # checked with the solve, in one read
        return K, B
