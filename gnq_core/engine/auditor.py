"""In-run GNQ: hooks on the user's own forward/backward, a B×B kernel, no extra pass.

    with GNQAuditor(model, lam=1e-2) as auditor:
        losses = per_example_loss(model, batch)      # [B], each example's own loss
        losses.sum().backward()                      # the training backward
        res = auditor.compute()                      # res.gnq: float64 [B]

Forward hooks save each covered module's inputs; a hook on the module's output gradient hands
both to the module's kernel as soon as that gradient exists, adds the module's B×B Gram block
to K and drops the saved tensors (only B×B accumulators live across the backward).  The hooks
never modify gradients, so training is unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from gnq_core.engine.coverage import Coverage, CoverageEntry, UncoveredParametersError, UseChecker
from gnq_core.engine.fused import FusedLayerNormFunction, FusedLinearFunction, fused_flops, ghost_linear_flops
from gnq_core.engine.kernels import Contribution, Kernel, kernel_for
from gnq_core.engine.kernels.base import first_input, hooks_are_suspended
from gnq_core.engine.kernels.embedding import EmbeddingKernel
from gnq_core.engine.kernels.linear import Conv1DKernel, LinearKernel
from gnq_core.engine.kernels.norm import LayerNormKernel
from gnq_core.engine.representations import (
    DEFAULT_MEMORY_BUDGET,
    DenseRep,
    OneHotFactor,
    OuterRep,
    Rep,
    inner,
    restrict_rows,
)
from gnq_core.engine.solve import GNQNumericalError, gnq_from_kernel, unweight_kernel

__all__ = ["GNQAuditor", "GNQResult", "BatchDimensionError", "check_lam"]


def check_lam(lam: float) -> float:
    """λ, refused unless a finite number > 0 (λ = 0 leaves S_{-j} singular whenever B − 1 < P)."""
    if not (lam > 0 and lam < float("inf")):
        raise ValueError(f"λ (--lam) must be a finite number > 0, got {lam:g}")
    return float(lam)


class BatchDimensionError(ValueError):
    """A covered module saw a tensor whose leading dimension is not the batch."""


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


@dataclass
class _Hooked:
    name: str
    module: nn.Module
    kernel: Kernel
    params: list[str]  # local names of the trainable parameters this module covers
    param_ids: list[int]


@dataclass
class _Call:
    """One forward call of a covered module, until its output gradients have arrived."""

    hooked: _Hooked
    saved: Any
    out_meta: list[tuple[torch.Size, torch.dtype, torch.device]]
    grads: list[torch.Tensor | None]
    received: int = 0
    done: bool = False


@dataclass
class _Pass:
    """State of one forward/backward: which calls used which parameter, and the K so far."""

    batch_size: int
    calls: list[_Call] = field(default_factory=list)
    uses: Counter = field(default_factory=Counter)  # id(param) -> calls that used it
    finished_uses: Counter = field(default_factory=Counter)
    pending: dict[int, list[Rep]] = field(default_factory=dict)  # shared params' earlier uses
    restricted_rows: dict[int, torch.Tensor] = field(default_factory=dict)
    kernel: torch.Tensor | None = None
    fired: bool = False
    repeated: bool = False
    paths: dict[str, set[str]] = field(default_factory=dict)
    call_counts: Counter = field(default_factory=Counter)
    frontier: list[torch.Tensor] = field(default_factory=list)  # outputs of input-end modules

    def add(self, block: torch.Tensor) -> None:
        self.kernel = block.clone() if self.kernel is None else self.kernel + block


class GNQAuditor:
    """Exact per-example GNQ for any PyTorch / Hugging Face model, inside its training loop.

    Args:
        model: the model being trained; every trainable parameter gets covered, or this raises
            ``UncoveredParametersError`` naming those that cannot be.
        lam: λ > 0, the ridge of S_{-j} = Σ_{k≠j} g_k g_kᵀ + λI, in the units of ‖g‖².
        path: "auto" picks ghost or materialise per layer by the cost model; "ghost" /
            "materialize" force one (for tests and benchmarks).
        memory_budget: bytes allowed for one Gram intermediate (chunks beyond it).
        check_uses: watch the first forward pass for parameters used outside their owning
            module (costs one slow forward; turn off only for a model already checked).
        fused: for Linear / HF Conv1D layers where materialising per-example gradients is
            cheaper, return their sum as the weight gradient so autograd's own weight-gradient
            matmul is skipped, and for LayerNorm reuse the forward's statistics
            (``gnq_core.engine.fused``).  ``param.grad`` then matches the unfused one to float
            rounding instead of bitwise.
    """

    def __init__(
        self,
        model: nn.Module,
        lam: float = 1e-2,
        *,
        path: Literal["auto", "ghost", "materialize"] = "auto",
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        check_uses: bool = True,
        fused: bool = False,
    ) -> None:
        check_lam(lam)
        if path not in ("auto", "ghost", "materialize"):
            raise ValueError(f"path must be 'auto', 'ghost' or 'materialize', got {path!r}")
        self.model = model
        self.lam = float(lam)
        self._path = None if path == "auto" else path
        self._budget = memory_budget
        self._enabled = True
        self._pass: _Pass | None = None
        self._computed_last = False
        self._handles: list[Any] = []
        self._fused_modules: list[nn.Module] = []
        self._fused_now: set[int] = set()  # modules whose current call went the fused way
        self._scratch: dict[torch.dtype, torch.Tensor] = {}  # fused path's CPU buffers, reused
        self._hooked = self._assign_kernels(model)
        self._static_coverage = self._describe(model)
        self._checker: UseChecker | None = None
        self._checker_active = False
        if check_uses:
            owners: dict[int, tuple[str, set[int], bool]] = {}
            names = {id(p): n for n, p in model.named_parameters()}
            for h in self._hooked:
                for pid in h.param_ids:
                    _, allowed, nested = owners.get(pid, (names[pid], set(), False))
                    owners[pid] = (names[pid], allowed | {id(h.module)}, nested or h.kernel.recurse)
            self._checker = UseChecker(model, owners)
        self._handles.append(model.register_forward_pre_hook(self._on_root_forward, with_kwargs=True))
        self._handles.append(model.register_forward_hook(self._on_root_done, always_call=True))
        for h in self._hooked:
            hook = functools.partial(self._on_forward, h)
            self._handles.append(h.module.register_forward_hook(hook, with_kwargs=True))
            if fused and type(h.kernel) in _FUSABLE and "forward" not in vars(h.module):
                h.module.forward = functools.partial(self._fused_forward, h)
                self._fused_modules.append(h.module)

    # ------------------------------------------------------------------ set-up
    @staticmethod
    def _assign_kernels(model: nn.Module) -> list[_Hooked]:
        trainable = {id(p) for p in model.parameters() if p.requires_grad}
        if not trainable:
            raise ValueError("the model has no trainable parameters (requires_grad=True)")
        hooked, claimed, covered = [], set(), set()
        for name, module in model.named_modules():
            if id(module) in claimed:
                continue
            kernel = kernel_for(module)
            params = module.named_parameters(recurse=kernel.recurse)
            mine = [(n, p) for n, p in params if p.requires_grad]
            if kernel.recurse:
                claimed.update(id(m) for m in module.modules())
            if mine:
                hooked.append(_Hooked(name, module, kernel, [n for n, _ in mine],
                                      [id(p) for _, p in mine]))
                covered.update(id(p) for _, p in mine)
        missing = trainable - covered
        if missing:  # cannot happen for registered parameters; kept as a guard
            names = {id(p): n for n, p in model.named_parameters()}
            raise UncoveredParametersError({names[i]: "no module" for i in missing})
        return hooked

    def _describe(self, model: nn.Module) -> Coverage:
        entries, seen = [], set()
        for h in self._hooked:
            params = [h.module.get_parameter(n) for n in h.params]
            entries.append(CoverageEntry(
                module=h.name, module_type=type(h.module).__name__, kernel=h.kernel.name,
                parameters=[f"{h.name}.{n}" if h.name else n for n in h.params],
                numel=sum(p.numel() for p in params)))
            seen.update(id(p) for p in params)
        unique = {id(p): p.numel() for p in model.parameters() if p.requires_grad}
        return Coverage(entries=entries, trainable_numel=sum(unique.values()),
                        covered_numel=sum(unique[i] for i in seen))

    @property
    def coverage(self) -> Coverage:
        """Which module covers which parameters, with which kernel (paths filled per batch)."""
        return self._static_coverage

    # ------------------------------------------------------------------ hooks
    def _on_root_forward(self, module, args, kwargs):
        if self._checker is not None and not self._checker_active and self._checker.done:
            self._checker.remove_hooks()  # safe here: hook dicts are copied before iteration
            self._checker = None
        if not self._enabled or hooks_are_suspended() or not torch.is_grad_enabled():
            return
        self._start_pass(_leading_dim(args, kwargs))
        if self._checker is not None and not self._checker.done:
            self._checker_active = True
            self._checker.__enter__()

    def _on_root_done(self, module, args, output):
        if not self._checker_active:
            return
        self._checker_active = False
        self._checker.__exit__(None, None, None)
        self._checker.done = True
        if self._checker.violations:
            raise UncoveredParametersError(self._checker.violations)

    def _start_pass(self, batch_size: int | None) -> _Pass:
        previous = self._pass
        if previous is not None and previous.fired:
            warnings.warn("GNQAuditor: a backward pass finished but compute() was not called "
                          "before the next forward; that batch's GNQ is discarded",
                          stacklevel=3)
        if batch_size is None:
            raise BatchDimensionError("cannot tell the batch size: the model got no tensor input")
        self._pass = _Pass(batch_size)
        self._computed_last = False
        return self._pass

    def _on_forward(self, h: _Hooked, module, args, kwargs, output):
        if id(module) in self._fused_now:  # the fused function reports to the auditor itself
            self._fused_now.discard(id(module))
            return None
        if not self._enabled or hooks_are_suspended() or not torch.is_grad_enabled():
            return None
        flat_out, spec = tree_flatten(output)
        diff = [i for i, o in enumerate(flat_out) if isinstance(o, torch.Tensor) and o.requires_grad]
        if not diff:
            return None
        if torch._C._current_graph_task_id() != -1:
            raise RuntimeError("GNQAuditor: a module ran its forward inside a backward pass "
                               "(activation checkpointing), which is not supported yet")
        p = self._pass or self._start_pass(_leading_dim(args, kwargs))
        B = p.batch_size
        expanded = False
        for i in diff:
            o = flat_out[i]
            if o.dim() == 0 or o.shape[0] not in (1, B):
                raise BatchDimensionError(
                    f"module '{h.name}' ({type(module).__name__}) returned shape {tuple(o.shape)}; "
                    f"per-example gradients need batch-first outputs [B={B}, ...]")
            if o.shape[0] == 1 and B > 1:  # broadcast over the batch (e.g. position embeddings):
                flat_out[i] = o.expand(B, *o.shape[1:])  # expand so each example's Δ is seen
                expanded = True
        if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in tree_flatten((args, kwargs))[0]):
            p.frontier.extend(flat_out[i] for i in diff)  # nothing upstream needs a gradient
        saved = h.kernel.capture(module, args, kwargs, output, B)
        call = _Call(h, saved, [(flat_out[i].shape, flat_out[i].dtype, flat_out[i].device)
                                for i in diff], [None] * len(diff))
        p.uses.update(h.param_ids)
        p.calls.append(call)
        for k, i in enumerate(diff):
            flat_out[i].register_hook(functools.partial(self._on_grad, p, call, k))
        return tree_unflatten(flat_out, spec) if expanded else None

    def _on_grad(self, p: _Pass, call: _Call, k: int, grad: torch.Tensor) -> None:
        if not self._enabled or p is not self._pass:
            return
        p.fired = True
        if call.done:
            p.repeated = True
            return
        call.grads[k] = grad.detach()
        call.received += 1
        if call.received == len(call.grads):
            self._process(p, call)

    # ------------------------------------------------------------------ kernel
    def _process(self, p: _Pass, call: _Call) -> None:
        h = call.hooked
        grads = [g if g is not None else torch.zeros(s, dtype=dt, device=dev)
                 for g, (s, dt, dev) in zip(call.grads, call.out_meta, strict=True)]
        contributions = h.kernel.contributions(h.module, call.saved, grads, h.params, self._split(p, h))
        call.saved, call.grads = None, None
        self._accumulate(p, call, contributions)

    @staticmethod
    def _split(p: _Pass, h: _Hooked) -> frozenset[str]:
        """Parameters of this module that other calls in this pass use too."""
        return frozenset(n for n, pid in zip(h.params, h.param_ids, strict=True) if p.uses[pid] > 1)

    def _accumulate(self, p: _Pass, call: _Call, contributions: list[Contribution],
                    label: str | None = None) -> None:
        """Add one finished call's Gram blocks (and cross terms of shared parameters) to K."""
        h = call.hooked
        call.done = True
        split = self._split(p, h)
        paths = p.paths.setdefault(h.name, set())
        p.call_counts[h.name] += 1
        ids = dict(zip(h.params, h.param_ids, strict=True))
        for c in contributions:
            block, path = self._gram(c.rep)
            p.add(block)
            paths.add(label or ("per-example" if path == "dense" else path))
            if len(c.params) == 1 and c.params[0] in split:  # shared: cross terms with other uses
                self._add_cross_terms(p, call, ids[c.params[0]], c.rep)
                paths.add("tied")
        self._finish_uses(p, call)

    @staticmethod
    def _finish_uses(p: _Pass, call: _Call) -> None:
        h = call.hooked
        for pid in h.param_ids:
            if p.uses[pid] > 1:
                p.finished_uses[pid] += 1
                if p.finished_uses[pid] == p.uses[pid]:
                    p.pending.pop(pid, None)

    # ------------------------------------------------------------------ fused path
    def _fused_forward(self, h: _Hooked, *args, **kwargs):
        module = h.module
        original = type(module).forward
        if (not self._enabled or hooks_are_suspended() or not torch.is_grad_enabled()
                or torch.is_autocast_enabled()):
            return original(module, *args, **kwargs)
        if type(h.kernel) is LayerNormKernel:
            return self._fused_layernorm(h, *args, **kwargs)
        if "weight" not in h.params:
            return original(module, *args, **kwargs)
        x = first_input(args, kwargs, "x" if type(h.kernel) is Conv1DKernel else "input")
        p = self._pass or self._start_pass(_leading_dim(args, kwargs))
        B = p.batch_size
        weight = module.weight
        rows, cols = weight.shape
        T = x.numel() // max(x.shape[0] * x.shape[-1], 1) if x.dim() > 1 else 1
        # a weight already used in this pass: fuse only behind embedding lookups (tied head)
        earlier = [c for c in p.calls if set(c.hooked.param_ids) & set(h.param_ids)]
        tied_ok = all(isinstance(c.hooked.kernel, EmbeddingKernel) for c in earlier)
        fuse = (x.dim() >= 2 and x.shape[0] == B and tied_ok and self._path != "ghost"
                and (self._path == "materialize"
                     or fused_flops(B, rows, cols) <= ghost_linear_flops(B, T, rows, cols)))
        if not fuse:
            return original(module, *args, **kwargs)
        sink = self._fused_call(h, p)
        return FusedLinearFunction.apply(x, weight, module.bias, type(h.kernel) is Conv1DKernel, sink,
                                         self._budget)

    def _fused_layernorm(self, h: _Hooked, *args, **kwargs):
        """LayerNorm's per-example gradients are B×d, so they are always formed (no cost choice)."""
        module = h.module
        x = first_input(args, kwargs)
        p = self._pass or self._start_pass(_leading_dim(args, kwargs))
        if x.dim() < 2 or x.shape[0] != p.batch_size or not h.params:
            return type(module).forward(module, *args, **kwargs)
        sink = self._fused_call(h, p)
        return FusedLayerNormFunction.apply(x, module.weight, module.bias, module.normalized_shape,
                                            module.eps, sink)

    def _fused_call(self, h: _Hooked, p: _Pass) -> _FusedSink:
        """Register a call that reports to the auditor from its own backward (no output hook)."""
        call = _Call(h, None, [], [])
        p.uses.update(h.param_ids)
        p.calls.append(call)
        self._fused_now.add(id(h.module))
        return _FusedSink(self, p, call)

    def _add_cross_terms(self, p: _Pass, call: _Call, pid: int, rep: Rep) -> None:
        """⟨a_j, b_k⟩ + ⟨b_j, a_k⟩ between this use of a shared parameter and earlier ones."""
        rows = p.restricted_rows.get(pid)
        if rows is not None:
            rep = restrict_rows(rep, rows) or rep
        earlier = p.pending.setdefault(pid, [])
        for other in earlier:
            p.add(self._cross(other, rep))
        if rows is None:  # keep only the rows later embedding uses can touch (tied wte/lm_head)
            rows = self._rows_still_needed(p, call, pid)
            if rows is not None:
                kept = [restrict_rows(r, rows) for r in [*earlier, rep]]
                if all(r is not None for r in kept):
                    p.restricted_rows[pid] = rows
                    earlier[:], rep = kept[:-1], kept[-1]
        earlier.append(rep)

    @staticmethod
    def _rows_still_needed(p: _Pass, call: _Call, pid: int) -> torch.Tensor | None:
        """Token rows of the uses of ``pid`` still to come, if they are all embedding lookups."""
        tokens = []
        for other in p.calls:
            if other is call or other.done or pid not in other.hooked.param_ids:
                continue
            if not isinstance(other.hooked.kernel, EmbeddingKernel):
                return None
            tokens.append(other.saved.reshape(-1))
        for rep in p.pending.get(pid, []):
            if isinstance(rep, OuterRep) and isinstance(rep.A, OneHotFactor):
                tokens.append(rep.A.tokens.reshape(-1))
        if not tokens:
            return None
        return torch.unique(torch.cat([t.to(tokens[0].device) for t in tokens]))

    # ------------------------------------------------------------------ extension points
    # The Gram blocks of K and the final B×B kernel go through these three methods, so a
    # subclass can change what "the batch" is (gnq_core.pipelines.distributed: the global batch of all
    # ranks) without touching the hooks or the bookkeeping.
    def _gram(self, rep: Rep) -> tuple[torch.Tensor, str]:
        """This pass's block ⟨g_j, g_k⟩ of one representation, and the path used."""
        return inner(rep, rep, self._path, self._budget)

    def _cross(self, a: Rep, b: Rep) -> torch.Tensor:
        """Cross terms ⟨a_j, b_k⟩ + ⟨b_j, a_k⟩ of two uses of one shared parameter."""
        cross, _ = inner(a, b, self._path, self._budget)
        return cross + cross.T

    def _batch_kernel(self, p: _Pass, weights: torch.Tensor | None) -> tuple[torch.Tensor, int]:
        """The finished pass's kernel for the per-example losses ℓ_j, and its batch size."""
        B = p.batch_size
        K = p.kernel
        if K is None:
            K = torch.zeros(B, B, dtype=torch.float64)
        if K.shape != (B, B):
            raise BatchDimensionError(f"kernel has shape {tuple(K.shape)} for a batch of {B}")
        if weights is not None:
            K = unweight_kernel(K, weights)
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
        if p is None or not p.frontier:
            loss.backward()
            return
        torch.autograd.grad(loss, p.frontier, allow_unused=True)
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
        K, B = self._batch_kernel(p, weights)
        try:
            solution = gnq_from_kernel(K, self.lam)
        except GNQNumericalError:
            self._pass = None  # this pass is spent (a NaN batch): the next one starts without a warning
            raise
        coverage = replace(self._static_coverage, entries=[
            replace(e, paths=set(p.paths.get(e.module, set())), calls=p.call_counts[e.module])
            for e in self._static_coverage.entries])
        self._pass = None
        self._computed_last = True
        return GNQResult(gnq=solution.gnq, kernel=K, coverage=coverage, lam=self.lam,
                         condition=solution.condition, batch_size=B)

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
        for module in self._fused_modules:
            del module.forward  # back to the class's own forward
        self._fused_modules.clear()
        self._scratch.clear()
        if self._checker is not None:
            if self._checker_active:
                self._checker.__exit__(None, None, None)
                self._checker_active = False
            self._checker.remove_hooks()
            self._checker = None
        self._pass = None

    def __enter__(self) -> GNQAuditor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _FusedSink:
    """Receives a fused layer's Gram (or gradients) during backward for one call of one pass."""

    def __init__(self, auditor: GNQAuditor, p: _Pass, call: _Call):
        self.auditor, self.p, self.call = auditor, p, call
        self.plan_rows: torch.Tensor | None = None

    def _live(self) -> bool:
        a, p = self.auditor, self.p
        if not a._enabled or p is not a._pass:
            return False
        p.fired = True
        if self.call.done:
            p.repeated = True
            return False
        return True

    def plan(self) -> tuple[str, torch.Tensor | None]:
        a, p, call = self.auditor, self.p, self.call
        split = a._split(p, call.hooked)
        if not split:
            return "gram", None
        pid = dict(zip(call.hooked.params, call.hooked.param_ids, strict=True)).get("weight")
        if split == {"weight"} and not p.pending.get(pid) and pid not in p.restricted_rows:
            rows = a._rows_still_needed(p, call, pid)  # a head tied to embeddings still to come
            if rows is not None:
                self.plan_rows = rows
                return "gram", rows
        return "gradients", None

    def accept_gram(self, gram: torch.Tensor, rows_grad: DenseRep | None) -> None:
        if not self._live():
            return
        a, p, h = self.auditor, self.p, self.call.hooked
        p.add(gram)
        if rows_grad is not None:  # cross terms of the tied weight, on the rows that matter
            pid = dict(zip(h.params, h.param_ids, strict=True))["weight"]
            p.restricted_rows[pid] = self.plan_rows
            a._add_cross_terms(p, self.call, pid, rows_grad)
        a._accumulate(p, self.call, [], label="fused")
        p.paths[h.name].add("fused")
        if rows_grad is not None:
            p.paths[h.name].add("tied")

    def workspace(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if device.type != "cpu":  # the CUDA caching allocator already reuses blocks
            return torch.empty(numel, dtype=dtype, device=device)
        scratch = self.auditor._scratch
        buf = scratch.get(dtype)
        if buf is None or buf.numel() < numel:
            buf = scratch[dtype] = torch.empty(numel, dtype=dtype)
        return buf[:numel]

    def accept_gradients(self, weight: DenseRep | None, bias: DenseRep | None) -> None:
        if not self._live():
            return
        parts = [Contribution((n,), r) for n, r in (("weight", weight), ("bias", bias)) if r is not None]
        self.auditor._accumulate(self.p, self.call, parts, label="fused")


_FUSABLE = (LinearKernel, Conv1DKernel, LayerNormKernel)


def _leading_dim(args: tuple, kwargs: dict) -> int | None:
    for leaf in tree_flatten((args, kwargs))[0]:
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    return None
