"""In-run GNQ: hooks on the user's own forward/backward, a B×B kernel, no extra pass.

    with GNQAuditor(model, lam=1e-2) as auditor:
        losses = per_example_loss(model, batch)      # [B], each example's own loss
        losses.sum().backward()                      # the training backward
        res = auditor.compute()                      # res.gnq: float64 [B]

Forward hooks save each covered module's inputs; a hook on the module's output gradient hands
both to the module's kernel as soon as that gradient exists, adds the module's B×B Gram block
to K and drops the saved tensors (only B×B accumulators live across the backward).  The hooks
never modify gradients, so training is unchanged.  By default Linear-like layers and LayerNorm
run fused instead (``gnq_core.engine.fused``: their backward forms the weight gradient from the
per-example ones), and norm layers keep their factors, within the memory budget, for one
stacked computation per shape at ``compute()`` (``gnq_core.engine.deferred``).

This module is the auditor's core: the hooks' lifetime, the extension points and the API.  One
pass's bookkeeping is ``engine.pass_state`` (cross terms of shared parameters: ``engine.tied``),
a fused call reports through ``engine.fused_sink``, kernels are assigned by ``engine.assignment``
and the first batch is checked by ``engine.first_batch``.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from gnq_core.engine.assignment import assign_kernels, describe
from gnq_core.engine.batch import BatchDimensionError, batch_first_outputs, leading_dim, model_family
from gnq_core.engine.compiled import check_not_compiled
from gnq_core.engine.coverage import Coverage
from gnq_core.engine.first_batch import FirstBatch
from gnq_core.engine.frontier import backward_targets, depends_on
from gnq_core.engine.fused import FuseRequest
from gnq_core.engine.fused_sink import FusedSink
from gnq_core.engine.grams import inner
from gnq_core.engine.kernels import Contribution, UnsupportedModuleError, can_fuse
from gnq_core.engine.kernels.base import hooks_are_suspended
from gnq_core.engine.pass_state import Call, Hooked, PassState
from gnq_core.engine.recompute import in_backward, is_duplicate, note_forward_call, shared_before
from gnq_core.engine.representations import DEFAULT_MEMORY_BUDGET, Rep
from gnq_core.engine.solve import (
    LAM_ABSOLUTE,
    WEIGHTS_MESSAGE,
    GNQNumericalError,
    check_lam_mode,
    effective_lam,
    gnq_from_kernel,
    unweight_kernel,
    weights_valid,
)

__all__ = ["GNQAuditor", "GNQResult", "BatchDimensionError"]


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


class GNQAuditor:
    """Exact per-example GNQ for any PyTorch / Hugging Face model, inside its training loop.

    Args:
        model: the model being trained; every trainable parameter gets covered, or this raises
            ``UncoveredParametersError`` naming those that cannot be.
        lam: λ > 0, the ridge of S_{-j} = Σ_{k≠j} g_k g_kᵀ + λI, in the units of ‖g‖².
        lam_mode: "absolute" (λ = lam) or "relative": λ_eff = lam · mean_j K_jj of each batch,
            scale-free (``solve.effective_lam``); ``GNQResult.lam`` is the λ each batch used.
        path: "auto" picks ghost or materialise per layer by the cost model; "ghost" /
            "materialize" force one (for tests and benchmarks).
        memory_budget: bytes allowed for one Gram intermediate (chunks beyond it), and for the
            norm layers' factors kept for ``compute()`` (``gnq_core.engine.deferred``; beyond
            it a layer's per-example gradients are formed at once).
        check_uses: probe the first batch once more, hooks off (``gnq_core.engine.planning``):
            follow the batch through the forward by provenance and cover modules that do not
            see batch-first tensors, or whose parameters another module uses, by the generic
            kernel on the innermost enclosing module that does (one extra forward; turn off only
            for a model already checked: then shapes are trusted).
        fused: (default) for Linear / HF Conv1D layers where materialising per-example gradients
            is cheaper, return their sum as the weight gradient so autograd's own weight-gradient
            matmul is skipped, and for LayerNorm keep the forward's statistics for one batched
            computation at ``compute()`` (``gnq_core.engine.fused``).  ``param.grad`` then
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
        if not lam > 0:
            raise ValueError(f"lam must be > 0, got {lam}")
        if path not in ("auto", "ghost", "materialize"):
            raise ValueError(f"path must be 'auto', 'ghost' or 'materialize', got {path!r}")
        self.model = model
        self.lam = float(lam)
        self.lam_mode = lam_mode
        self._path = None if path == "auto" else path
        self._budget = memory_budget
        self._enabled = True
        self._pass: PassState | None = None
        self._computed_last = False
        self._handles: list[Any] = []
        self._fused_modules: list[nn.Module] = []
        self._fused_now: set[int] = set()  # modules whose current call went the fused way
        # CPU buffers reused across steps (fused chunks; norm layers' stacks at compute()), by
        # (dtype, slot): a fresh 100 MB tensor per step costs more in page faults than its arithmetic
        self._scratch: dict[tuple[torch.dtype, str], torch.Tensor] = {}
        self._hooked = assign_kernels(model)
        self._static_coverage = describe(model, self._hooked)
        self._first = FirstBatch(model, self._hooked, check_uses)
        self._handles.append(model.register_forward_pre_hook(self._on_root_forward, with_kwargs=True))
        self._handles.append(model.register_forward_hook(self._on_root_done, always_call=True))
        self._fused = fused
        self._module_handles: list[Any] = []
        self._install_module_hooks()

    def _install_module_hooks(self) -> None:
        for h in self._hooked:
            hook = functools.partial(self._on_forward, h)
            self._module_handles.append(h.module.register_forward_hook(hook, with_kwargs=True))
            if hasattr(h.kernel, "before"):  # generic re-runs: the call's random-number state
                self._module_handles.append(h.module.register_forward_pre_hook(
                    functools.partial(self._on_pre_forward, h), with_kwargs=True))
            if self._fused and can_fuse(h.module) and "forward" not in vars(h.module):
                h.module.forward = functools.partial(self._fused_forward, h)
                self._fused_modules.append(h.module)

    def _remove_module_hooks(self) -> None:
        for handle in self._module_handles:
            handle.remove()
        self._module_handles.clear()
        for module in self._fused_modules:
            del module.forward  # back to the class's own forward
        self._fused_modules.clear()

    def _plan(self, args: tuple, kwargs: dict) -> None:
        """Probe the first batch (gnq_core.engine.planning) and re-assign kernels by its plan."""
        plan = self._first.plan(self._hooked, args, kwargs)
        if plan is None:
            return
        self._remove_module_hooks()
        self._hooked = assign_kernels(self.model, plan)
        self._static_coverage = describe(self.model, self._hooked)
        self._install_module_hooks()

    @property
    def coverage(self) -> Coverage:
        """Which module covers which parameters, with which kernel (paths filled per batch)."""
        return self._static_coverage

    # ------------------------------------------------------------------ hooks
    def _on_root_forward(self, module, args, kwargs):
        self._first.settle()
        if not self._enabled or hooks_are_suspended() or not torch.is_grad_enabled():
            return
        if self._first.wants_plan(args, kwargs):
            self._plan(args, kwargs)
            for h in self._hooked:  # hooks added during this call's pre-hooks run from the next one
                if h.module is module and hasattr(h.kernel, "before"):
                    h.kernel.before(module, args, kwargs)
        self._start_pass(leading_dim(args, kwargs))
        self._first.watch()

    def _on_root_done(self, module, args, output):
        self._first.forward_done()

    def _start_pass(self, batch_size: int | None) -> PassState:
        previous = self._pass
        if previous is not None and previous.fired:
            warnings.warn("GNQAuditor: a backward pass finished but compute() was not called "
                          "before the next forward; that batch's GNQ is discarded",
                          stacklevel=3)
        if batch_size is None:
            raise BatchDimensionError("cannot tell the batch size: the model got no tensor input")
        self._pass = PassState(batch_size, self, self._budget, self._workspace)
        self._computed_last = False
        self.on_pass_start(batch_size)
        return self._pass

    def _on_pre_forward(self, h: Hooked, module, args, kwargs=None) -> None:
        # kwargs=None: a hook removed by the first batch's plan while this module's pre-hooks ran
        if self._enabled and not hooks_are_suspended() and torch.is_grad_enabled():
            if in_backward() and (self._pass is None or is_duplicate(self._pass, module, count=False)):
                return  # a checkpoint's recomputation of a call already captured
            h.kernel.before(module, args, kwargs or {})

    def _on_forward(self, h: Hooked, module, args, kwargs, output):
        if id(module) in self._fused_now:  # the fused function reports to the auditor itself
            self._fused_now.discard(id(module))
            return None
        if not self._enabled or hooks_are_suspended() or not torch.is_grad_enabled():
            return None
        if isinstance(output, torch.Tensor):  # the common case, without pytree's walk
            flat_out, spec = [output], None
        else:
            flat_out, spec = tree_flatten(output)
        diff = [i for i, o in enumerate(flat_out) if isinstance(o, torch.Tensor) and o.requires_grad]
        if not diff:
            return None
        recomputing = in_backward()  # activation checkpointing (engine/recompute.py)
        if recomputing and (self._pass is None or is_duplicate(self._pass, module)):
            return None
        p = self._pass or self._start_pass(leading_dim(args, kwargs))
        B = p.batch_size
        expanded = batch_first_outputs(flat_out, diff, B, self.model, h.name, module)
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        ends = [i for i in diff if not depends_on([flat_out[i]], inputs)]  # nothing upstream needs a gradient
        if ends:
            params = [module.get_parameter(n) for n in h.params]
            p.frontier.extend((flat_out[i], flat_out[i]._version, params) for i in ends)
        with self._named(h):
            saved = h.kernel.capture(module, args, kwargs, output, B)
        call = Call(h, saved, [(flat_out[i].shape, flat_out[i].dtype, flat_out[i].device) for i in diff],
                    [None] * len(diff))
        p.register(call)
        if not recomputing:
            note_forward_call(p, module)
        for k, i in enumerate(diff):
            flat_out[i].register_hook(functools.partial(self._on_grad, p, call, k))
        if not expanded:
            return None
        return flat_out[0] if spec is None else tree_unflatten(flat_out, spec)

    def _is_current(self, p: PassState) -> bool:
        """Whether ``p`` is the pass being audited now (not paused, not replaced)."""
        return self._enabled and p is self._pass

    def _on_grad(self, p: PassState, call: Call, k: int, grad: torch.Tensor) -> None:
        if not self._is_current(p) or not p.arrive(call):
            return
        call.grads[k] = grad.detach()
        call.received += 1
        if call.received == len(call.grads):
            self._process(p, call)

    # ------------------------------------------------------------------ kernel
    def _process(self, p: PassState, call: Call) -> None:
        h = call.hooked
        grads = [g if g is not None else torch.zeros(s, dtype=dt, device=dev)
                 for g, (s, dt, dev) in zip(call.grads, call.out_meta, strict=True)]
        with self._named(h):
            contributions = h.kernel.contributions(h.module, call.saved, grads, h.params, p.split(h))
        call.saved, call.grads = None, None
        p.accumulate(call, self.on_contributions(h, contributions))

    @contextlib.contextmanager
    def _named(self, h: Hooked) -> Iterator[None]:
        """A kernel's refusal, in one line naming the model family and the module."""
        try:
            yield
        except UnsupportedModuleError as exc:
            raise UnsupportedModuleError(
                f"{model_family(self.model)}: module '{h.name}' ({type(h.module).__name__}): {exc}") from exc

    # ------------------------------------------------------------------ fused path
    def _fused_forward(self, h: Hooked, *args, **kwargs):
        """The module's forward through its kernel's fused function, when the kernel takes it."""
        module = h.module
        if self._enabled and not hooks_are_suspended() and torch.is_grad_enabled():
            p = self._pass or self._start_pass(leading_dim(args, kwargs))
            shared = any(pid in p.used_beyond_lookups for pid in h.param_ids)
            sink = functools.partial(self._fused_call, h, p)
            if in_backward() and is_duplicate(p, module):  # the same function again, recording nothing
                sink = functools.partial(self._dead_sink, h, p)
                shared = shared_before(p, h.param_ids, module)  # as the forward's call saw it
            request = FuseRequest(p.batch_size, tuple(h.params), self._path, self._budget, shared, sink)
            out = h.kernel.fused_forward(module, args, kwargs, request)
            if out is not NotImplemented:
                return out
        return type(module).forward(module, *args, **kwargs)

    def _fused_call(self, h: Hooked, p: PassState) -> FusedSink:
        """Register a call that reports to the auditor from its own backward (no output hook)."""
        call = Call(h, None, [], [])
        p.register(call)
        note_forward_call(p, h.module)
        self._fused_now.add(id(h.module))
        return FusedSink(p, call, self._is_current, self._workspace)

    def _dead_sink(self, h: Hooked, p: PassState) -> FusedSink:
        """A checkpoint's recomputation of a call already captured: its backward never runs."""
        self._fused_now.add(id(h.module))
        return FusedSink(p, Call(h, None, [], []), lambda _: False, self._workspace)

    def _workspace(self, numel: int, dtype: torch.dtype, device: torch.device, slot: str = "fused"
                   ) -> torch.Tensor:
        if device.type != "cpu":  # the CUDA caching allocator already reuses blocks
            return torch.empty(numel, dtype=dtype, device=device)
        buf = self._scratch.get((dtype, slot))
        if buf is None or buf.numel() < numel:
            buf = self._scratch[(dtype, slot)] = torch.empty(numel, dtype=dtype)
        return buf[:numel]

    # ------------------------------------------------------------------ extension points
    # The Gram blocks of K, a tied weight's rows and the final B×B kernel go through these
    # public methods, so a subclass can change what "the batch" is (gnq_core.engine.distributed:
    # the global batch of all ranks) without touching the hooks or the bookkeeping.
    def on_pass_start(self, batch_size: int) -> None:
        """Called when a forward pass of ``batch_size`` examples starts being audited."""

    def on_contributions(self, h: Hooked, contributions: list[Contribution]) -> list[Contribution]:
        """A hooked call's per-example gradient representations, before their Gram blocks are
        added to K; returns those K gets (``engine.window`` keeps or sketches them across the
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
        K = kernel
        if K is None:
            K = torch.zeros(B, B, dtype=torch.float64)
        if K.shape != (B, B):
            raise BatchDimensionError(f"kernel has shape {tuple(K.shape)} for a batch of {B}")
        if weights is not None:
            K = unweight_kernel(K, weights, validate=False)  # checked with the solve, in one read
        return K, B

    # ------------------------------------------------------------------ API
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
        except GNQNumericalError:
            self._pass = None  # this pass is spent (a NaN batch): the next one starts without a warning
            raise
        except UnsupportedModuleError:
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
                checks.append((check[0].to(device), f"{model_family(self.model)}: module '{h.name}' "
                               f"({type(h.module).__name__}): {check[1]}", UnsupportedModuleError))
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

    def __enter__(self) -> GNQAuditor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

