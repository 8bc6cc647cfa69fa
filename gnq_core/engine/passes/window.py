"""GNQ over the batch of one optimizer step: all micro-batches of an accumulation window (DESIGN.md §9).

``WindowAuditor`` (``GNQAuditor(..., batch="step")``) is the per-micro-batch auditor that also
hands every contribution (parameter key, representation of its per-example gradients) to the
window, for each micro-batch:

* ``mode="exact"``: the window keeps the representations (ghost factors or per-example
  gradients) of its micro-batches while they fit ``window_budget`` bytes; at the end K's
  diagonal blocks are the micro-batches' exact kernels and every cross block ⟨g^a_j, g^b_k⟩
  (micro-batches a ≠ b, same θ: nothing steps inside a window) is Σ over parameters and over
  pairs of their uses of ``grams.inner`` — the same ghost/materialise Grams as within
  a batch.  GNQ over the window then equals GNQ of all its texts audited as one batch.
* ``mode="sketch"``: each micro-batch's per-example gradients are reduced to seeded sketches
  (``engine.sketch``), k-dimensional per parameter; the window keeps only those and K is
  their Gram (approximate: the error is measured, ``benchmarks/sketch_error.py``).
* ``mode="auto"`` (default): exact while the window's representations fit the budget; a window
  that outgrows it sketches what it kept and goes on sketching (its result says "sketch").

All run the auditor's hook path (``fused=False``: a fused layer reports only its Gram, so the
representations come from ``MicroAuditor.on_contributions``).
A window of fewer than 2 texts gets no GNQ (``WindowResult.gnq`` is None), never K_jj/λ; a
window with a non-finite micro-batch raises ``GNQNumericalError`` at ``finish_window()`` (and is
then over: the next micro-batch starts a new one).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gnq_core.common.values import require, whole
from gnq_core.engine.kernels import Contribution
from gnq_core.engine.math.representations import DenseRep, OuterRep, Rep, factor_tensor
from gnq_core.engine.math.solve import GNQNumericalError, effective_lam, gnq_from_kernel
from gnq_core.engine.passes.micro import GNQResult, MicroAuditor
from gnq_core.engine.plan.assignment import Hooked
from gnq_core.engine.sketch.projection import SketchBatch, Sketcher, SketchSpec, vocab_keys, weight_matrices
from gnq_core.errors import GNQError

WINDOW_MODES = ("auto", "exact", "sketch")
DEFAULT_WINDOW_BUDGET = 1 << 30


class WindowBudgetError(GNQError, MemoryError):
    """An exact window's kept representations outgrew its memory budget."""


@dataclass
class WindowResult:
    gnq: torch.Tensor | None  # float64 [B_eff], None: fewer than 2 texts in the window
    kernel: torch.Tensor  # float64 [B_eff, B_eff] (exact, or the Gram of the sketches)
    lam: float | None
    batch_size: int  # B_eff
    micro_batches: int
    mode: str
    k: int | None  # sketch dimension per matrix (None: exact)
    seed: int | None
    condition: float | None = None  # of K + λI (None: no GNQ)

    @property
    def self_influence(self) -> torch.Tensor:
        return self.kernel.diagonal().clone()


@dataclass
class _Micro:
    batch_size: int
    weights: torch.Tensor | None
    kernel: torch.Tensor | None = None  # exact block (exact mode)
    reps: dict[str, list[Rep]] = field(default_factory=dict)
    sketch: SketchBatch | None = None


def _nbytes(rep: Rep) -> int:
    if isinstance(rep, DenseRep):
        return rep.G.nbytes
    return factor_tensor(rep.A).nbytes + factor_tensor(rep.C).nbytes


def _loss_sketches(m: _Micro, widths: dict[str, int]) -> torch.Tensor:
    """A sketched micro-batch's [B, m] sketches of its per-example-loss gradients (rows / w_j)."""
    assert m.sketch is not None
    S = m.sketch.matrix(widths)
    return S if m.weights is None else S / m.weights.to(S.device).reshape(-1, 1)


class WindowAuditor(MicroAuditor):
    """GNQ over accumulation windows.  Per micro-batch: forward, backward of Σ_j w_j ℓ_j, then
    ``add_micro_batch(weights)``; at the optimizer step ``finish_window()``.

    ``compute()`` still gives the current micro-batch's own GNQ (the per-micro-batch mode).
    """

    def __init__(self, model: nn.Module, lam: float = 1e-2, *, mode: str = "auto",
                 sketch: SketchSpec | None = None, window_budget: int = DEFAULT_WINDOW_BUDGET,
                 keep_exact: bool | None = None, **kwargs: Any) -> None:
        if mode not in WINDOW_MODES:
            raise ValueError(f"window mode must be one of {', '.join(WINDOW_MODES)}, got {mode!r}")
        whole(window_budget, "window_budget (bytes)", 1, sys.maxsize)  # now, not at the first step
        require(sketch is None or isinstance(sketch, SketchSpec),
                f"sketch must be a SketchSpec or None, got {type(sketch).__name__}")
        kwargs["fused"] = False  # every call's representations must reach on_contributions
        super().__init__(model, lam, **kwargs)
        self.mode = mode
        self.spec = sketch or SketchSpec()
        self.window_budget = int(window_budget)
        # exact micro-batch kernels: needed in exact mode; in sketch mode only for comparisons
        self.keep_exact = mode != "sketch" if keep_exact is None else keep_exact
        self._window_mode = "sketch" if mode == "sketch" else "exact"  # this window's, so far
        self._names = {id(p): n for n, p in model.named_parameters()}
        vocab = vocab_keys(model, self._names)
        self.sketcher = Sketcher(self.spec, vocab, weight_matrices(model, vocab, self._names))
        self._current: _Micro | None = None
        self._window: list[_Micro] = []
        self._kept_bytes = 0
        self._failure: GNQNumericalError | None = None

    # ------------------------------------------------------------------ per contribution
    def on_pass_start(self, batch_size: int) -> None:
        super().on_pass_start(batch_size)
        sketch = SketchBatch(batch_size) if self._window_mode == "sketch" else None
        self._current = _Micro(batch_size, None, sketch=sketch)

    def on_contributions(self, h: Hooked, contributions: list[Contribution]) -> list[Contribution]:
        """Keep (exact) or sketch (sketch) each parameter's representation for the window; K of
        the micro-batch itself gets them only while exact kernels are kept."""
        micro = self._current
        formed = []
        for c in contributions:
            if not isinstance(c.rep, OuterRep | DenseRep):  # a norm layer's record: form it once
                c = Contribution(c.params, DenseRep(c.rep.materialize()))
            key = "+".join(self._names[h.ids[n]] for n in c.params)
            if micro is not None:
                if micro.sketch is not None:
                    self.sketcher.add(micro.sketch, key, c.rep)
                else:
                    self._keep(micro, key, c.rep)
            formed.append(c)
        return formed if self.keep_exact else []

    def _keep(self, micro: _Micro, key: str, rep: Rep) -> None:
        self._kept_bytes += _nbytes(rep)
        if self._kept_bytes > self.window_budget and self.mode == "auto":
            self._switch_to_sketch()
            assert micro.sketch is not None
            self.sketcher.add(micro.sketch, key, rep)
            return
        if self._kept_bytes > self.window_budget:
            raise WindowBudgetError(
                f"exact window: the kept per-example gradient factors exceed {self.window_budget:,} bytes "
                f"after {len(self._window) + 1} micro-batch(es); use mode='sketch' or a larger window_budget")
        micro.reps.setdefault(key, []).append(rep)

    def _switch_to_sketch(self) -> None:
        """``auto``: the window outgrew the budget; sketch what was kept and go on sketching."""
        micros = [*self._window, *([self._current] if self._current is not None else [])]
        for m in micros:
            m.sketch = SketchBatch(m.batch_size)
            for key, reps in m.reps.items():
                for r in reps:
                    self.sketcher.add(m.sketch, key, r)
            m.reps = {}
        self._kept_bytes = 0
        self._window_mode = "sketch"

    # ------------------------------------------------------------------ window
    def add_micro_batch(self, weights: torch.Tensor | None = None) -> GNQResult | None:
        """Close the current micro-batch (after its backward) and add it to the window.
        ``weights``: its objective was Σ_j w_j ℓ_j (w for this micro-batch's texts).  Returns the
        micro-batch's own exact result (the per-micro-batch mode), or None in sketch mode without
        ``keep_exact`` (its exact kernel is not computed)."""
        micro = self._current
        if micro is None or self._pass is None or not self._pass.fired:
            raise RuntimeError("add_micro_batch() needs a finished backward pass of a new micro-batch")
        try:
            result: GNQResult | None = super().compute(weights)
        except GNQNumericalError as exc:  # a NaN loss or gradient: the window fails at its end
            result, self._failure = None, exc
        if self.keep_exact:
            B = micro.batch_size
            micro.kernel = result.kernel if result is not None else torch.full((B, B), float("nan"),
                                                                                dtype=torch.float64)
        micro.weights = None if weights is None else weights.detach().to(torch.float64).reshape(-1).cpu()
        self._window.append(micro)
        self._current = None
        return result if self.keep_exact else None

    def held_bytes(self) -> int:
        """Bytes the window holds now for its micro-batches (kept factors or sketches)."""
        total = 0
        for m in self._window:
            total += sum(_nbytes(r) for reps in m.reps.values() for r in reps)
            if m.sketch is not None:
                total += sum(t.nbytes for t in m.sketch.parts.values())
        return total

    def finish_window(self) -> WindowResult:
        """GNQ of every text of the window against all the window's other texts; starts a new
        window.  Fewer than 2 texts: ``gnq`` None (no companions: GNQ is not defined)."""
        mode, self._window_mode = self._window_mode, "sketch" if self.mode == "sketch" else "exact"
        window = self._take_window("finish_window()")
        K = self.sketch_kernel(window) if mode == "sketch" else self.exact_kernel(window)
        B = K.shape[0]
        k, seed = (self.spec.k, self.spec.seed) if mode == "sketch" else (None, None)
        if B < 2:
            return WindowResult(None, K, None, B, len(window), mode, k, seed)
        lam = effective_lam(K, self.lam, self.lam_mode)
        solution = gnq_from_kernel(K, lam)
        return WindowResult(solution.gnq, K, lam, B, len(window), mode, k, seed, solution.condition)

    def take_sketches(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The window's sketches [B_eff, m] in ``dtype``, without a solve; starts a new window
        (post hoc companions, ``engine.sketch.companions``).  Sketch mode only; a micro-batch with a
        non-finite loss or gradient raises ``GNQNumericalError`` as ``finish_window`` does."""
        if self.mode != "sketch":
            raise RuntimeError("take_sketches() needs mode='sketch'")
        window = self._take_window("take_sketches()")
        widths = self.sketcher.widths()
        out = torch.empty(sum(m.batch_size for m in window), sum(widths.values()), dtype=dtype)
        row = 0
        for m in window:  # each micro-batch's parts are let go once copied: one copy held at a time
            S = _loss_sketches(m, widths)
            out = out.to(S.device)
            out[row:row + m.batch_size] = S
            row += m.batch_size
            m.sketch = None
        return out

    def _take_window(self, caller: str) -> list[_Micro]:
        """The window's micro-batches, a new window started; an empty or failed window raises."""
        window, self._window, self._kept_bytes = self._window, [], 0
        failure, self._failure = self._failure, None
        if not window:
            raise RuntimeError(f"{caller} on an empty window: add micro-batches first")
        if failure is not None:
            raise GNQNumericalError(f"a micro-batch of this window: {failure}") from failure
        return window

    def sketch_kernel(self, window: list[_Micro]) -> torch.Tensor:
        S = self.window_sketches(window)
        return S @ S.T

    def window_sketches(self, window: list[_Micro], dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """[B_eff, m] sketches of the window's per-example-loss gradients (float64 by default)."""
        widths = self.sketcher.widths()
        return torch.cat([_loss_sketches(m, widths).to(dtype) for m in window])

    def exact_kernel(self, window: list[_Micro]) -> torch.Tensor:
        """The window's exact K: micro-batch kernels on the diagonal, cross blocks from the kept
        representations (uses of one parameter in a and in b: every pair)."""
        sizes = [m.batch_size for m in window]
        offsets = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        device = window[0].kernel.device if window[0].kernel is not None else torch.device("cpu")
        K = torch.zeros(offsets[-1], offsets[-1], dtype=torch.float64, device=device)
        for a, ma in enumerate(window):
            assert ma.kernel is not None
            K[offsets[a]:offsets[a + 1], offsets[a]:offsets[a + 1]] = ma.kernel
            for b in range(a + 1, len(window)):
                mb = window[b]
                block = torch.zeros(ma.batch_size, mb.batch_size, dtype=torch.float64, device=device)
                for key, reps_a in ma.reps.items():
                    for ra in reps_a:
                        for rb in mb.reps.get(key, []):
                            gram, _ = self.pair_gram(ra, rb)
                            block += gram.to(device)
                if ma.weights is not None:
                    block = block / ma.weights.to(device).reshape(-1, 1)
                if mb.weights is not None:
                    block = block / mb.weights.to(device).reshape(1, -1)
                K[offsets[a]:offsets[a + 1], offsets[b]:offsets[b + 1]] = block
                K[offsets[b]:offsets[b + 1], offsets[a]:offsets[a + 1]] = block.T
        return K


__all__ = ["DEFAULT_WINDOW_BUDGET", "WINDOW_MODES", "WindowAuditor", "WindowBudgetError", "WindowResult"]
