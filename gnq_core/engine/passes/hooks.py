"""The auditor's hooks: each covered call captured in the forward, its output gradients handed
to its kernel in the backward, and fused calls' sinks (``engine.passes.fused_sink``).

Forward hooks save each covered module's inputs; a hook on the module's output gradient hands
both to the module's kernel as soon as that gradient exists, adds the module's B×B Gram block
to K and drops the saved tensors (only B×B accumulators live across the backward).  The hooks
never modify gradients, so training is unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from gnq_core.engine.kernels import UnsupportedModuleError, can_fuse
from gnq_core.engine.kernels.base import hooks_are_suspended
from gnq_core.engine.kernels.fused import FuseRequest
from gnq_core.engine.math.cost_model import InnerPath
from gnq_core.engine.passes.extension_points import ExtensionPoints
from gnq_core.engine.passes.first_batch import FirstBatch
from gnq_core.engine.passes.fused_sink import FusedSink
from gnq_core.engine.passes.pass_state import Call, PassState
from gnq_core.engine.passes.recompute import in_backward, is_duplicate, note_forward_call, shared_before
from gnq_core.engine.plan.assignment import Hooked, assign_kernels, describe
from gnq_core.engine.plan.batch import BatchDimensionError, batch_first_outputs, leading_dim, module_label
from gnq_core.engine.plan.compiled import compile_guard
from gnq_core.engine.plan.frontier import depends_on
from gnq_core.engine.plan.plan_reuse import PlanCache


class AuditHooks(ExtensionPoints):
    """The hooks ``GNQAuditor`` installs on ``model``, and the passes they open."""

    def __init__(self, model: nn.Module, path: InnerPath | None, budget: int, fused: bool,
                 check_uses: bool) -> None:
        self.model = model
        self._path, self._budget, self._fused = path, budget, fused
        self._enabled = True
        self._compile_guard = compile_guard(model)
        self._pass: PassState | None = None
        self._computed_last = False
        self._fused_modules: list[nn.Module] = []
        self._fused_now: set[int] = set()  # modules whose current call went the fused way
        # CPU buffers reused across steps (fused chunks; norm layers' stacks at compute()), by
        # (dtype, slot): a fresh 100 MB tensor per step costs more in page faults than its arithmetic
        self._scratch: dict[tuple[torch.dtype, str], torch.Tensor] = {}
        self._hooked = assign_kernels(model)
        self._static_coverage = describe(model, self._hooked)
        self._first = FirstBatch(model, self._hooked, check_uses)
        self._handles = [model.register_forward_pre_hook(self._on_root_forward, with_kwargs=True),
                         model.register_forward_hook(self._on_root_done, always_call=True)]
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

    def reuse_plans(self, plans: PlanCache) -> None:
        """Take the first batch's plan from ``plans`` where it provably holds for this model
        (``engine.plan.plan_reuse``: an audit's next checkpoint), and keep this one's there."""
        self._first.plans = plans

    def _plan(self, args: tuple, kwargs: dict) -> None:
        """Probe the first batch (gnq_core.engine.plan.planning) and re-assign kernels by its plan."""
        plan = self._first.plan(self._hooked, args, kwargs)
        if plan is None:
            return
        self._remove_module_hooks()
        self._hooked = assign_kernels(self.model, plan)
        self._static_coverage = describe(self.model, self._hooked)
        self._install_module_hooks()

    def _workspace(self, numel: int, dtype: torch.dtype, device: torch.device, slot: str = "fused"
                   ) -> torch.Tensor:
        if device.type != "cpu":  # the CUDA caching allocator already reuses blocks
            return torch.empty(numel, dtype=dtype, device=device)
        buf = self._scratch.get((dtype, slot))
        if buf is None or buf.numel() < numel:
            buf = self._scratch[(dtype, slot)] = torch.empty(numel, dtype=dtype)
        return buf[:numel]

    def _recording(self) -> bool:
        """Whether a forward now is audited (not paused, hooks not suspended, autograd on)."""
        return self._enabled and not hooks_are_suspended() and torch.is_grad_enabled()

    def _on_root_forward(self, module, args, kwargs):
        self._first.settle()
        if not self._recording():
            return
        self._compile_guard()  # compiled after the auditor attached: hooks traced, probes blind
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
        if self._recording():
            if in_backward() and (self._pass is None or is_duplicate(self._pass, module, count=False)):
                return  # a checkpoint's recomputation of a call already captured
            h.kernel.before(module, args, kwargs or {})

    def _on_forward(self, h: Hooked, module, args, kwargs, output):
        if id(module) in self._fused_now:  # the fused function reports to the auditor itself
            self._fused_now.discard(id(module))
            return None
        if not self._recording():
            return None
        if isinstance(output, torch.Tensor):  # the common case, without pytree's walk
            flat_out, spec = [output], None
        else:
            flat_out, spec = tree_flatten(output)
        diff = [i for i, o in enumerate(flat_out) if isinstance(o, torch.Tensor) and o.requires_grad]
        if not diff:
            return None
        recomputing = in_backward()  # activation checkpointing (engine/passes/recompute.py)
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
            raise UnsupportedModuleError(f"{module_label(self.model, h.name, h.module)}: {exc}") from exc

    # ------------------------------------------------------------------ fused path
    def _fused_forward(self, h: Hooked, *args, **kwargs):
        """The module's forward through its kernel's fused function, when the kernel takes it."""
        module = h.module
        if self._recording():
            p = self._pass or self._start_pass(leading_dim(args, kwargs))
            again = in_backward() and is_duplicate(p, module)  # the same function again, recording nothing
            shared = (shared_before(p, h.param_ids, module) if again  # as the forward's call saw it
                      else any(pid in p.used_beyond_lookups for pid in h.param_ids))
            sink = functools.partial(self._fused_call, h, p, not again)
            request = FuseRequest(p.batch_size, tuple(h.params), self._path, self._budget, shared, sink)
            out = h.kernel.fused_forward(module, args, kwargs, request)
            if out is not NotImplemented:
                return out
        return type(module).forward(module, *args, **kwargs)

    def _fused_call(self, h: Hooked, p: PassState, recorded: bool) -> FusedSink:
        """Register a call that reports to the auditor from its own backward (no output hook);
        not ``recorded``: a checkpoint's recomputation of a call already captured, whose backward
        never runs."""
        self._fused_now.add(id(h.module))
        call = Call(h, None, [], [])
        if not recorded:
            return FusedSink(p, call, lambda _: False, self._workspace)
        p.register(call)
        note_forward_call(p, h.module)
        return FusedSink(p, call, self._is_current, self._workspace)
