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
from gnq_core.engine.deferred import NormRecord, NormRep, batched_per_example, group
from gnq_core.engine.frontier import backward_targets, depends_on, used_inside
from gnq_core.engine.fused import FuseRequest, sync_free
from gnq_core.engine.kernels import Contribution, Kernel, UnsupportedModuleError, can_fuse, kernel_for
from gnq_core.engine.kernels.base import dense_contributions, hooks_are_suspended
from gnq_core.engine.kernels.generic import planned_kernel
from gnq_core.engine.planning import Plan, probe, probeable
from gnq_core.engine.representations import (
    DEFAULT_MEMORY_BUDGET,
    DenseRep,
    OneHotFactor,
    OuterRep,
    Rep,
    inner,
    restrict_rows,
)
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
from gnq_core.errors import GNQError

__all__ = ["GNQAuditor", "GNQResult", "BatchDimensionError"]


# Per-example gradients at most this wide (elements per example) are not turned into a Gram
# block at once but kept for one joint Gram per step; more than DEFER_TOTAL kept are flushed.
DEFER_WIDTH = 2**16
DEFER_TOTAL = 2**18


class BatchDimensionError(GNQError, ValueError):
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

    @functools.cached_property
    def ids(self) -> dict[str, int]:
        return dict(zip(self.params, self.param_ids, strict=True))


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
    # outputs of input-end modules, with their version when the hook saw them and their module
    frontier: list[tuple[torch.Tensor, int, list[torch.Tensor]]] = field(default_factory=list)
    used_beyond_lookups: set[int] = field(default_factory=set)  # params used by non-lookup calls
    deferred: dict[tuple, list[torch.Tensor]] = field(default_factory=dict)  # narrow G, one Gram later
    acc: dict[tuple, torch.Tensor] = field(default_factory=dict)  # fused Grams by (dtype, device, upper)
    norms: list[NormRecord] = field(default_factory=list)  # norm layers' factors, batched at compute()
    norm_bytes: int = 0

    def register(self, call: _Call) -> None:
        h = call.hooked
        self.uses.update(h.param_ids)
        if not h.kernel.row_lookup:
            self.used_beyond_lookups.update(h.param_ids)
        self.calls.append(call)

    def add(self, block: torch.Tensor) -> None:
        if self.kernel is None:
            self.kernel = block.clone()
        else:
            self.kernel.add_(block)


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
        self._pass: _Pass | None = None
        self._computed_last = False
        self._handles: list[Any] = []
        self._fused_modules: list[nn.Module] = []
        self._fused_now: set[int] = set()  # modules whose current call went the fused way
        # CPU buffers reused across steps (fused chunks; norm layers' stacks at compute()), by
        # (dtype, slot): a fresh 100 MB tensor per step costs more in page faults than its arithmetic
        self._scratch: dict[tuple[torch.dtype, str], torch.Tensor] = {}
        self._hooked = self._assign_kernels(model)
        self._static_coverage = self._describe(model)
        self._checker: UseChecker | None = None
        self._checker_active = False
        self._planned = not check_uses  # check_uses: plan from a probe of the first batch
        if check_uses:
            self._checker = UseChecker(model, self._owners())
        self._handles.append(model.register_forward_pre_hook(self._on_root_forward, with_kwargs=True))
        self._handles.append(model.register_forward_hook(self._on_root_done, always_call=True))
        self._fused = fused
        self._module_handles: list[Any] = []
        self._install_module_hooks()

    def _owners(self, ids: dict[str, list[int]] | None = None) -> dict[int, tuple[str, set[int], bool]]:
        """id(param) -> (name, ids of the modules allowed to use it, whether nested uses are ok).

        ``ids``: each hooked module's parameter ids now (FSDP2 swaps the registered parameters
        for unsharded ones during the forward)."""
        owners: dict[int, tuple[str, set[int], bool]] = {}
        names = {id(p): n for n, p in self.model.named_parameters()}
        for h in self._hooked:
            for pid in (ids or {}).get(h.name, h.param_ids):
                _, allowed, nested = owners.get(pid, (names[pid], set(), False))
                owners[pid] = (names[pid], allowed | {id(h.module)}, nested or h.kernel.recurse)
        return owners

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
        self._planned = True
        if self._checker is not None:  # the probe checks parameter uses itself
            self._checker.remove_hooks()
            self._checker = None
        B = _leading_dim(args, kwargs)
        if B is None:
            return
        covered = {h.name: [id(h.module.get_parameter(n)) for n in h.params] for h in self._hooked}
        plan = probe(self.model, args, kwargs, B, covered, self._owners(covered))
        if plan.violations:
            raise UncoveredParametersError(plan.violations)
        if plan.refused:
            name, why = next(iter(plan.refused.items()))
            module = self.model.get_submodule(name)
            raise BatchDimensionError(
                f"{_family(self.model)}: module '{name}' ({type(module).__name__}) {why}, and no "
                "enclosing module sees batch-first tensors, so its per-example gradients cannot be "
                "attributed")
        self._remove_module_hooks()
        self._hooked = self._assign_kernels(self.model, plan)
        self._static_coverage = self._describe(self.model)
        self._install_module_hooks()

    # ------------------------------------------------------------------ set-up
    @staticmethod
    def _assign_kernels(model: nn.Module, plan: Plan | None = None) -> list[_Hooked]:
        trainable = {id(p) for p in model.parameters() if p.requires_grad}
        if not trainable:
            raise ValueError("the model has no trainable parameters (requires_grad=True)")
        hooked, claimed, covered = [], set(), set()
        for name, module in model.named_modules():
            if id(module) in claimed:
                continue
            kernel = planned_kernel(name, kernel_for(module), plan)
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
        bound = {id(h.module): h.param_ids for h in hooked}
        return [h for h in (_without_inner_aliases(h, bound) for h in hooked) if h.params]

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
        if not self._planned and probeable(args, kwargs):
            self._plan(args, kwargs)
            for h in self._hooked:  # hooks added during this call's pre-hooks run from the next one
                if h.module is module and hasattr(h.kernel, "before"):
                    h.kernel.before(module, args, kwargs)
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
        self.on_pass_start(batch_size)
        return self._pass

    def _on_pre_forward(self, h: _Hooked, module, args, kwargs=None) -> None:
        # kwargs=None: a hook removed by the first batch's plan while this module's pre-hooks ran
        if self._enabled and not hooks_are_suspended() and torch.is_grad_enabled():
            h.kernel.before(module, args, kwargs or {})

    def _on_forward(self, h: _Hooked, module, args, kwargs, output):
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
                    f"{_family(self.model)}: module '{h.name}' ({type(module).__name__}) returned shape "
                    f"{tuple(o.shape)}; "
                    f"per-example gradients need batch-first outputs [B={B}, ...]")
            if o.shape[0] == 1 and B > 1:  # broadcast over the batch (e.g. position embeddings):
                flat_out[i] = o.expand(B, *o.shape[1:])  # expand so each example's Δ is seen
                expanded = True
        for i in used_inside(flat_out, diff):  # the hook must see only the uses outside the module
            flat_out[i] = flat_out[i].view_as(flat_out[i])
            expanded = True
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        ends = [i for i in diff if not depends_on([flat_out[i]], inputs)]  # nothing upstream needs a gradient
        if ends:
            params = [module.get_parameter(n) for n in h.params]
            p.frontier.extend((flat_out[i], flat_out[i]._version, params) for i in ends)
        with self._named(h):
            saved = h.kernel.capture(module, args, kwargs, output, B)
        call = _Call(h, saved, [(flat_out[i].shape, flat_out[i].dtype, flat_out[i].device)
                                for i in diff], [None] * len(diff))
        p.register(call)
        for k, i in enumerate(diff):
            flat_out[i].register_hook(functools.partial(self._on_grad, p, call, k))
        if not expanded:
            return None
        return flat_out[0] if spec is None else tree_unflatten(flat_out, spec)

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
        with self._named(h):
            contributions = h.kernel.contributions(h.module, call.saved, grads, h.params, self._split(p, h))
        call.saved, call.grads = None, None
        self._accumulate(p, call, contributions)

    @contextlib.contextmanager
    def _named(self, h: _Hooked) -> Iterator[None]:
        """A kernel's refusal, in one line naming the model family and the module."""
        try:
            yield
        except UnsupportedModuleError as exc:
            raise UnsupportedModuleError(
                f"{_family(self.model)}: module '{h.name}' ({type(h.module).__name__}): {exc}") from exc

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
        ids = h.ids
        for c in contributions:
            shared = len(c.params) == 1 and c.params[0] in split
            if isinstance(c.rep, NormRep):
                if not shared and self._defer_norm(p, c.rep.record):
                    paths.add(label or "per-example")
                    continue
                c = replace(c, rep=DenseRep(c.rep.materialize()))
            if not shared and isinstance(c.rep, DenseRep) and c.rep.G.shape[1] <= DEFER_WIDTH:
                self._defer(p, c.rep.G)  # narrow (norm layers, biases): one Gram for all of them
                path = "dense"
            else:
                block, path = self.gram_block(c.rep)
                p.add(block)
            paths.add(label or ("per-example" if path == "dense" else path))
            if shared:  # cross terms with the parameter's other uses
                self._add_cross_terms(p, call, ids[c.params[0]], c.rep)
                paths.add("tied")
        self._finish_uses(p, call)

    def _defer(self, p: _Pass, G: torch.Tensor) -> None:
        """Keep narrow per-example gradients [B, n] for one joint Gram (fewer launches per step:
        the Gram of their concatenation is the sum of their Grams)."""
        key = (G.dtype, G.device)
        p.deferred.setdefault(key, []).append(G)
        if sum(g.shape[1] for g in p.deferred[key]) > DEFER_TOTAL:
            self._flush_deferred(p)

    def _flush_deferred(self, p: _Pass) -> None:
        for parts in p.deferred.values():
            block, _ = self.gram_block(DenseRep(parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)))
            p.add(block)
        p.deferred.clear()

    def _defer_norm(self, p: _Pass, record: NormRecord) -> bool:
        """Keep a norm layer's factors for ``compute()`` while they fit the memory budget."""
        if p.norm_bytes + record.nbytes > self._budget:
            return False
        p.norms.append(record)
        p.norm_bytes += record.nbytes
        return True

    def _flush_norms(self, p: _Pass) -> None:
        """Per-example gradients of all deferred norm layers, one stacked pass per shape."""
        with torch.no_grad():  # a fused LayerNorm's saved input still carries its grad_fn
            for records in group(p.norms):
                workspace = None if sync_free(records[0].x) else self._workspace
                self._defer(p, batched_per_example(records, workspace))
        p.norms.clear()
        p.norm_bytes = 0

    @staticmethod
    def _accumulator(p: _Pass, dtype: torch.dtype, device: torch.device, upper: bool = False) -> torch.Tensor:
        acc = p.acc.get((dtype, device, upper))
        if acc is None:
            acc = p.acc[(dtype, device, upper)] = torch.zeros(p.batch_size, p.batch_size, dtype=dtype,
                                                              device=device)
        return acc

    @staticmethod
    def _fold_accumulators(p: _Pass) -> None:
        for (_, _, upper), acc in p.acc.items():
            if upper:  # only j ≤ k was accumulated (the rest is partial or zero): mirror it
                acc = acc.triu()
                acc = acc + acc.triu(1).T
            p.add(acc if acc.dtype == torch.float64 else acc.to(torch.float64))
        p.acc.clear()

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
        """The module's forward through its kernel's fused function, when the kernel takes it."""
        module = h.module
        if self._enabled and not hooks_are_suspended() and torch.is_grad_enabled():
            p = self._pass or self._start_pass(_leading_dim(args, kwargs))
            shared = any(pid in p.used_beyond_lookups for pid in h.param_ids)
            request = FuseRequest(p.batch_size, tuple(h.params), self._path, self._budget, shared,
                                  functools.partial(self._fused_call, h, p))
            out = h.kernel.fused_forward(module, args, kwargs, request)
            if out is not NotImplemented:
                return out
        return type(module).forward(module, *args, **kwargs)

    def _fused_call(self, h: _Hooked, p: _Pass) -> _FusedSink:
        """Register a call that reports to the auditor from its own backward (no output hook)."""
        call = _Call(h, None, [], [])
        p.register(call)
        self._fused_now.add(id(h.module))
        return _FusedSink(self, p, call)

    def _sink_live(self, p: _Pass, call: _Call) -> bool:
        """A fused call's backward reached its sink: False if that pass is no longer current."""
        if not self._enabled or p is not self._pass:
            return False
        p.fired = True
        if call.done:
            p.repeated = True
            return False
        return True

    def _sink_plan(self, p: _Pass, call: _Call) -> tuple[str, torch.Tensor | None]:
        """What a fused call must hand back (``GradientSink.plan``)."""
        if not self._sink_live(p, call):  # its Gram must not reach the pass's accumulator
            return "off", None
        split = self._split(p, call.hooked)
        if not split:
            return "gram", None
        pid = call.hooked.ids.get("weight")
        if split == {"weight"} and not p.pending.get(pid) and pid not in p.restricted_rows:
            rows = self._rows_still_needed(p, call, pid)  # a head tied to embeddings still to come
            if rows is not None:
                return "gram", rows
        return "gradients", None

    def _sink_gram(self, p: _Pass, call: _Call, narrow: torch.Tensor | None, rows: torch.Tensor | None,
                   rows_grad: DenseRep | None) -> None:
        """The call's weight Gram is in the pass's accumulator; ``narrow``: its bias gradients."""
        if not self._sink_live(p, call):
            return
        h = call.hooked
        if narrow is not None:
            self._defer(p, narrow)
        if rows_grad is not None:  # cross terms of the tied weight, on the rows that matter
            pid = h.ids["weight"]
            p.restricted_rows[pid] = rows
            self._add_cross_terms(p, call, pid, rows_grad)
        self._accumulate(p, call, [], label="fused")
        p.paths[h.name].add("fused")
        if rows_grad is not None:
            p.paths[h.name].add("tied")

    def _sink_defer_norm(self, p: _Pass, call: _Call, record: NormRecord) -> bool:
        if not self._sink_live(p, call):
            return True  # not this pass's: the plain backward, nothing recorded
        if self._split(p, call.hooked) or not self._defer_norm(p, record):
            return False
        self._accumulate(p, call, [], label="fused")
        p.paths[call.hooked.name].add("fused")
        return True

    def _sink_gradients(self, p: _Pass, call: _Call, weight: DenseRep | None, bias: DenseRep | None) -> None:
        if not self._sink_live(p, call):
            return
        given = {n: r.G for n, r in (("weight", weight), ("bias", bias)) if r is not None}
        self._accumulate(p, call, dense_contributions(given, self._split(p, call.hooked)), label="fused")

    def _workspace(self, numel: int, dtype: torch.dtype, device: torch.device, slot: str = "fused"
                   ) -> torch.Tensor:
        if device.type != "cpu":  # the CUDA caching allocator already reuses blocks
            return torch.empty(numel, dtype=dtype, device=device)
        buf = self._scratch.get((dtype, slot))
        if buf is None or buf.numel() < numel:
            buf = self._scratch[(dtype, slot)] = torch.empty(numel, dtype=dtype)
        return buf[:numel]

    def _add_cross_terms(self, p: _Pass, call: _Call, pid: int, rep: Rep) -> None:
        """⟨a_j, b_k⟩ + ⟨b_j, a_k⟩ between this use of a shared parameter and earlier ones."""
        rows = p.restricted_rows.get(pid)
        if rows is not None:
            rep = restrict_rows(rep, rows) or rep
        earlier = p.pending.setdefault(pid, [])
        for other in earlier:
            p.add(self.cross_block(other, rep))
        if rows is None:  # keep only the rows later embedding uses can touch (tied wte/lm_head)
            rows = self._rows_still_needed(p, call, pid)
            if rows is not None:
                kept = [restrict_rows(r, rows) for r in [*earlier, rep]]
                if all(r is not None for r in kept):
                    p.restricted_rows[pid] = rows
                    earlier[:], rep = kept[:-1], kept[-1]
        earlier.append(rep)

    def _rows_still_needed(self, p: _Pass, call: _Call, pid: int) -> torch.Tensor | None:
        """Token rows of the uses of ``pid`` still to come, if they are all row lookups."""
        tokens = []
        for other in p.calls:
            if other is call or other.done or pid not in other.hooked.param_ids:
                continue
            touched = other.hooked.kernel.rows_touched(other.saved)
            if touched is None:
                return self.merge_rows(None, call.hooked.module.get_parameter(call.hooked.params[0]).device)
            tokens.append(touched)
        for rep in p.pending.get(pid, []):
            if isinstance(rep, OuterRep) and isinstance(rep.A, OneHotFactor):
                tokens.append(rep.A.tokens.reshape(-1))
        rows = None
        if tokens:  # sorted, with repeats: counting distinct tokens would wait for the device
            rows = torch.sort(torch.cat([t.to(tokens[0].device) for t in tokens])).values
        return self.merge_rows(rows, call.hooked.module.get_parameter(call.hooked.params[0]).device)

    # ------------------------------------------------------------------ extension points
    # The Gram blocks of K, a tied weight's rows and the final B×B kernel go through these
    # public methods, so a subclass can change what "the batch" is (gnq_core.pipelines.distributed:
    # the global batch of all ranks) without touching the hooks or the bookkeeping.
    def on_pass_start(self, batch_size: int) -> None:
        """Called when a forward pass of ``batch_size`` examples starts being audited."""

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
        self._flush_norms(p)
        self._flush_deferred(p)
        self._fold_accumulators(p)
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
                checks.append((check[0].to(device), f"{_family(self.model)}: module '{h.name}' "
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
    """The ``GradientSink`` of one fused call of one pass: hands what its backward formed to the
    auditor that registered the call."""

    def __init__(self, auditor: GNQAuditor, p: _Pass, call: _Call):
        self.auditor, self.p, self.call = auditor, p, call
        self.rows: torch.Tensor | None = None

    def plan(self) -> tuple[str, torch.Tensor | None]:
        mode, self.rows = self.auditor._sink_plan(self.p, self.call)
        return mode, self.rows

    def accumulator(self, dtype: torch.dtype, device: torch.device, upper: bool = False) -> torch.Tensor:
        return self.auditor._accumulator(self.p, dtype, device, upper)

    def accept_gram(self, narrow: torch.Tensor | None, rows_grad: DenseRep | None) -> None:
        self.auditor._sink_gram(self.p, self.call, narrow, self.rows, rows_grad)

    def defer_norm(self, record: NormRecord) -> bool:
        return self.auditor._sink_defer_norm(self.p, self.call, record)

    def accept_gradients(self, weight: DenseRep | None, bias: DenseRep | None) -> None:
        self.auditor._sink_gradients(self.p, self.call, weight, bias)

    def workspace(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.auditor._workspace(numel, dtype, device)


def _without_inner_aliases(h: _Hooked, bound: dict[int, list[int]]) -> _Hooked:
    """``h`` without the parameters that a module inside it also binds (BERT's
    ``cls.predictions.bias`` is ``cls.predictions.decoder.bias``).  The inner module's own
    kernel covers such a parameter; kept on the outer one too, its gradient would count twice.
    A direct use by the outer module is then found by the first batch's probe, which covers
    the outer module by the enclosing kernel."""
    inner_ids = {pid for m in h.module.modules() if m is not h.module for pid in bound.get(id(m), ())}
    keep = [i for i, pid in enumerate(h.param_ids) if pid not in inner_ids]
    if len(keep) == len(h.params):
        return h
    return replace(h, params=[h.params[i] for i in keep], param_ids=[h.param_ids[i] for i in keep])


def _family(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return str(getattr(config, "model_type", None) or type(model).__name__)


def _leading_dim(args: tuple, kwargs: dict) -> int | None:
    for leaf in tree_flatten((args, kwargs))[0]:
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    return None
