"""The ``GradientSink`` (``engine.kernels.fused``) of one fused call: what its backward formed, into its pass.

A fused layer's backward forms its per-example gradients itself and reports them here instead
of through an output-gradient hook: its Gram (already in the pass's accumulator), its per-example
gradients (a parameter other calls use too), or a norm layer's factors for ``compute()``.  The
call reports only while its pass is the auditor's current one and the auditor is not paused
(``is_current``); otherwise its backward is a plain layer's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gnq_core.engine.kernels.base import dense_contributions
from gnq_core.engine.kernels.deferred import NormRecord, Workspace
from gnq_core.engine.math.representations import DenseRep
from gnq_core.engine.passes.pass_state import Call, PassState


class FusedSink:
    """The sink of one fused call of one pass."""

    def __init__(self, p: PassState, call: Call, is_current: Callable[[PassState], bool],
                 workspace: Workspace):
        self.p, self.call, self.is_current, self._workspace = p, call, is_current, workspace
        self.rows: torch.Tensor | None = None

    def _live(self) -> bool:
        """The call's backward reached its sink: False if its pass is no longer current."""
        return self.is_current(self.p) and self.p.arrive(self.call)

    def plan(self) -> tuple[str, torch.Tensor | None]:
        mode, self.rows = self._plan()
        return mode, self.rows

    def _plan(self) -> tuple[str, torch.Tensor | None]:
        p, call = self.p, self.call
        if not self._live():  # its Gram must not reach the pass's accumulator
            return "off", None
        split = p.split(call.hooked)
        if not split:
            return "gram", None
        pid = call.hooked.ids.get("weight")
        if split == {"weight"} and not p.pending.get(pid) and pid not in p.restricted_rows:
            rows = p.rows_still_needed(call, pid)  # a head tied to embeddings still to come
            if rows is not None:
                return "gram", rows
        return "gradients", None

    def accumulator(self, dtype: torch.dtype, device: torch.device, upper: bool = False) -> torch.Tensor:
        return self.p.accumulator(dtype, device, upper)

    def accept_gram(self, narrow: torch.Tensor | None, rows_grad: DenseRep | None) -> None:
        """The call's weight Gram is in the pass's accumulator; ``narrow``: its bias gradients."""
        if not self._live():
            return
        p, call = self.p, self.call
        h = call.hooked
        if narrow is not None:
            p.defer(narrow)
        if rows_grad is not None:  # cross terms of the tied weight, on the rows that matter
            pid = h.ids["weight"]
            p.restricted_rows[pid] = self.rows
            p.add_cross_terms(call, pid, rows_grad)
        p.accumulate(call, [], label="fused")
        p.paths[h.name].add("fused")
        if rows_grad is not None:
            p.paths[h.name].add("tied")

    def defer_norm(self, record: NormRecord) -> bool:
        if not self._live():
            return True  # not this pass's: the plain backward, nothing recorded
        p, call = self.p, self.call
        if p.split(call.hooked) or not p.defer_norm(record):
            return False
        p.accumulate(call, [], label="fused")
        p.paths[call.hooked.name].add("fused")
        return True

    def accept_gradients(self, weight: DenseRep | None, bias: DenseRep | None) -> None:
        if not self._live():
            return
        given = {n: r.G for n, r in (("weight", weight), ("bias", bias)) if r is not None}
        split = self.p.split(self.call.hooked)
        self.p.accumulate(self.call, dense_contributions(given, split), label="fused")

    def workspace(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self._workspace(numel, dtype, device)
