"""In-run GNQ per micro-batch of one process: hooks on the user's own forward/backward, a B×B
kernel, no extra pass.  Users reach it (and the classes built on it) through ``GNQAuditor``
(``engine.auditor``: ``batch="micro", scope="rank"``, the default).

    with GNQAuditor(model, lam=1e-2) as auditor:
        losses = per_example_loss(model, batch)      # [B], each example's own loss
        losses.sum().backward()                      # the training backward
        res = auditor.compute()                      # res.gnq: float64 [B]

This module is the auditor's core: its settings, ``backward`` and ``compute``.  The engine's
parts, by job: the hooks and the passes they open (``engine.passes.hooks``), the steps a subclass
overrides to change what the batch is (``engine.passes.extension_points``), one pass's bookkeeping
(``engine.passes.pass_state``, tied weights' cross terms included), the fused Linear-like
and LayerNorm layers (``engine.kernels.fused``, reporting through ``engine.passes.fused_sink``; norm layers'
factors kept for ``compute()``: ``engine.kernels.deferred``), the kernels (``engine.kernels``, assigned
by ``engine.plan.assignment``) and the first batch's checks (``engine.passes.first_batch``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import nn

from gnq_core.common.values import finite, flag, whole
from gnq_core.engine.kernels import UnsupportedModuleError
from gnq_core.engine.math.representations import DEFAULT_MEMORY_BUDGET
from gnq_core.engine.math.solve import (
    LAM_ABSOLUTE,
    WEIGHTS_MESSAGE,
    GNQNumericalError,
    check_lam_mode,
    effective_lam,
    gnq_from_kernel,
    weights_valid,
)
from gnq_core.engine.passes.hooks import AuditHooks
from gnq_core.engine.plan.batch import BatchDimensionError, module_label
from gnq_core.engine.plan.compiled import check_not_compiled
from gnq_core.engine.plan.coverage import Coverage
from gnq_core.engine.plan.frontier import backward_targets

__all__ = ["BatchDimensionError", "GNQResult", "MicroAuditor"]


@dataclass
class GNQResult:
    gnq: torch.Tensor  # float64 [B]
    kernel: torch.Tensor  # float64 [B, B]: K_jk = ⟨g_j, g_k⟩ for the per-example losses ℓ_j
    coverage: Coverage
    lam: float
    condition: float  # condition number of K + λI
    batch_size: int

    @property
    def self_influence(self) -> torch.Tensor:
        """K_jj = ‖g_j‖² (TraceIn-style self-influence), float64 [B]."""
        return self.kernel.diagonal().clone()


class MicroAuditor(AuditHooks):
    """Exact per-example GNQ of each forward/backward's examples (``GNQAuditor``'s default).

    Args:
        model: the model being trained; every trainable parameter gets covered, or this raises
            ``UncoveredParametersError`` naming those that cannot be.
        lam: λ > 0, the ridge of S_{-j} = Σ_{k≠j} g_k g_kᵀ + λI, in the units of ‖g‖².
        lam_mode: "absolute" (λ = lam) or "relative": λ_eff = lam · mean_j K_jj of each batch,
            scale-free (``solve.effective_lam``); ``GNQResult.lam`` is the λ each batch used.
        path: "auto" picks ghost or materialise per layer by the cost model; "ghost" /
            "materialize" force one (for tests and benchmarks).
        memory_budget: bytes allowed for one Gram intermediate (chunks beyond it), and for the
            norm layers' factors kept for ``compute()`` (``gnq_core.engine.kernels.deferred``; beyond
            it a layer's per-example gradients are formed at once).
        check_uses: probe the first batch once more, hooks off (``gnq_core.engine.plan.planning``):
            follow the batch through the forward by provenance and cover modules that do not
            see batch-first tensors, or whose parameters another module uses, by the generic
            kernel on the innermost enclosing module that does (one extra forward; turn off only
            for a model already checked: then shapes are trusted).
        fused: (default) for Linear / HF Conv1D layers where materialising per-example gradients
            is cheaper, return their sum as the weight gradient so autograd's own weight-gradient
            matmul is skipped, and for LayerNorm keep the forward's statistics for one batched
            computation at ``compute()`` (``gnq_core.engine.kernels.fused``).  ``param.grad`` then
            matches autograd's to float rounding instead of bitwise; ``fused=False`` keeps
            autograd's own weight gradients (bitwise) and adds only hooks.  For a post-hoc
            audit (``backward()``, no weight gradients wanted) ``fused=False`` is the cheaper.
    """

    def __init__(
        self,
        model: nn.Module,
        lam: float = 1e-2,
        *,
        path: Literal["auto", "ghost", "materialize"] = "auto",
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        check_uses: bool = True,
        fused: bool = True,
        lam_mode: str = LAM_ABSOLUTE,
    ) -> None:
        check_lam_mode(lam_mode)
        check_not_compiled(model)  # hooks and probes need eager modules: refused before any is added
        finite(lam, "lam", 0.0, above=True)
        whole(memory_budget, "memory_budget (bytes)", 1, sys.maxsize)
        flag(check_uses, "check_uses"), flag(fused, "fused")
        if path not in ("auto", "ghost", "materialize"):
            raise ValueError(f"path must be 'auto', 'ghost' or 'materialize', got {path!r}")
        self.lam = float(lam)
        self.lam_mode = lam_mode
        super().__init__(model, None if path == "auto" else path, memory_budget, fused, check_uses)

    @property
    def coverage(self) -> Coverage:
        """Which module covers which parameters, with which kernel (paths filled per batch)."""
        return self._static_coverage

    def backward(self, loss: torch.Tensor) -> None:
        """The backward a post-hoc audit needs: every covered module's output gradient, no ``.grad``.

        Differentiates only w.r.t. the outputs of the modules at the input end of the graph
        (those whose inputs need no gradient, e.g. embeddings), so autograd skips every
        weight-gradient matmul — about half of a training backward — while every module's
        output gradient, all the kernels use, is still formed.  ``param.grad`` is left alone.
        """
        p = self._pass
        # a fused call reports from its own backward, which runs only if its weight is a target
        fused = {} if p is None else {
            id(w): w for c in p.calls if c.hooked.kernel.fusable and not c.out_meta
            for w in [c.hooked.module.get_parameter(n) for n in c.hooked.params]}
        if p is None or not (p.frontier or fused):
            loss.backward()
            return
        torch.autograd.grad(loss, [*backward_targets(p.frontier), *fused.values()], allow_unused=True)
        p.frontier.clear()

    def compute(self, weights: torch.Tensor | None = None) -> GNQResult:
        """GNQ of every example of the last backward pass.

        ``weights``: the objective was Σ_j w_j ℓ_j (e.g. w_j = 1/B for a batch mean); the
        kernel is rescaled to the per-example losses ℓ_j.  Default: the plain sum (w_j = 1).
        """
        p = self._pass
        if p is None or not p.fired:
            if self._computed_last:
                raise RuntimeError("compute() was already called for this backward pass; run the "
                                   "next forward and backward first")
            raise RuntimeError("compute() called before a backward pass: run the forward, then "
                               "backward() on the (weighted) sum of per-example losses")
        if p.repeated:
            self._pass = None
            raise RuntimeError("backward ran more than once through one forward pass "
                               "(retain_graph=True); GNQ is defined per backward of a batch")
        for call in p.calls:  # outputs of which only some received a gradient
            if not call.done and call.received and call.saved is not None:
                self._process(p, call)
        p.flush_norms()
        p.flush_deferred()
        p.fold_accumulators()
        K, B = self.batch_kernel(p.kernel, p.batch_size, weights)
        extra = [] if weights is None else [(weights_valid(weights.detach().to(K.device)), WEIGHTS_MESSAGE)]
        extra += self._replay_checks(K.device)
        lam = effective_lam(K, self.lam, self.lam_mode)
        solution = gnq_from_kernel(K, lam, check=False)
        try:
            condition = solution.check(extra)  # the step's one device-to-host read
        except (GNQNumericalError, UnsupportedModuleError):
            # this pass is spent (a NaN batch, a failed re-run): the next one starts without a warning
            self._pass = None
            raise
        coverage = replace(self._static_coverage, entries=[
            replace(e, paths=set(p.paths.get(e.module, set())), calls=p.call_counts[e.module])
            for e in self._static_coverage.entries])
        self._pass = None
        self._computed_last = True
        return GNQResult(gnq=solution.gnq, kernel=K, coverage=coverage, lam=lam,
                         condition=condition, batch_size=B)

    def _replay_checks(self, device: torch.device) -> list[tuple[torch.Tensor, str, type]]:
        """Generic re-runs of this pass that must have reproduced the batch's outputs."""
        checks = []
        for h in self._hooked:
            check = h.kernel.take_check() if hasattr(h.kernel, "take_check") else None
            if check is not None:
                why = f"{module_label(self.model, h.name, h.module)}: {check[1]}"
                checks.append((check[0].to(device), why, UnsupportedModuleError))
        return checks

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Forward/backward passes inside this block are ignored by the auditor."""
        previous = self._enabled
        self._enabled = False
        try:
            yield
        finally:
            self._enabled = previous

    def close(self) -> None:
        """Remove every hook; the model is left exactly as it was."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._remove_module_hooks()
        self._scratch.clear()
        self._first.close()
        self._pass = None

    def __enter__(self) -> MicroAuditor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
