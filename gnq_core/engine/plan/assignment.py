"""Which module's kernel covers which trainable parameters (the auditor's set-up).

Every module gets the kernel registered for its type (``kernels.kernel_for``) or, by the first
batch's plan (``engine.plan.planning``), the generic kernel on an enclosing module; a kernel that
recurses claims its submodules' parameters.  Every trainable parameter ends up covered once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from torch import nn

from gnq_core.engine.kernels import Kernel, kernel_for
from gnq_core.engine.kernels.generic import GenericKernel
from gnq_core.engine.kernels.registry import generic_kernel
from gnq_core.engine.plan.coverage import Coverage, CoverageEntry, UncoveredParametersError
from gnq_core.engine.plan.planning import Plan


@dataclass
class Hooked:
    """A covered module: its kernel and the trainable parameters it covers."""

    name: str
    module: nn.Module
    kernel: Kernel
    params: list[str]  # local names of the trainable parameters this module covers
    param_ids: list[int]

    @functools.cached_property
    def ids(self) -> dict[str, int]:
        return dict(zip(self.params, self.param_ids, strict=True))


def planned_kernel(name: str, kernel: Kernel, plan: Plan | None) -> Kernel:
    """The kernel the first batch's plan gives module ``name`` (``kernel``: its registered one)."""
    if plan is None:
        return kernel
    if name in plan.enclose:
        base = kernel if isinstance(kernel, GenericKernel) else generic_kernel()
        return base.bound(plan.in_dims.get(name), enclosing=True)
    if isinstance(kernel, GenericKernel):
        return kernel.bound(plan.in_dims.get(name))
    return kernel


def assign_kernels(model: nn.Module, plan: Plan | None = None) -> list[Hooked]:
    """The covered modules of ``model``, each with its kernel and the parameters it covers."""
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
            hooked.append(Hooked(name, module, kernel, [n for n, _ in mine], [id(p) for _, p in mine]))
            covered.update(id(p) for _, p in mine)
    missing = trainable - covered
    if missing:  # cannot happen for registered parameters; kept as a guard
        names = {id(p): n for n, p in model.named_parameters()}
        raise UncoveredParametersError({names[i]: "no module" for i in missing})
    bound = {id(h.module): h.param_ids for h in hooked}
    return [h for h in (_without_inner_aliases(h, bound) for h in hooked) if h.params]


def describe(model: nn.Module, hooked: list[Hooked]) -> Coverage:
    """Which module covers which parameters, with which kernel."""
    entries, seen = [], set()
    for h in hooked:
        params = [h.module.get_parameter(n) for n in h.params]
        entries.append(CoverageEntry(
            module=h.name, module_type=type(h.module).__name__, kernel=h.kernel.name,
            parameters=[f"{h.name}.{n}" if h.name else n for n in h.params],
            numel=sum(p.numel() for p in params)))
        seen.update(id(p) for p in params)
    unique = {id(p): p.numel() for p in model.parameters() if p.requires_grad}
    return Coverage(entries=entries, trainable_numel=sum(unique.values()),
                    covered_numel=sum(unique[i] for i in seen))


def owners(model: nn.Module, hooked: list[Hooked], ids: dict[str, list[int]] | None = None
           ) -> dict[int, tuple[str, set[int], bool]]:
    """id(param) -> (name, ids of the modules allowed to use it, whether nested uses are ok).

    ``ids``: each hooked module's parameter ids now (FSDP2 swaps the registered parameters
    for unsharded ones during the forward)."""
    found: dict[int, tuple[str, set[int], bool]] = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for h in hooked:
        for pid in (ids or {}).get(h.name, h.param_ids):
            _, allowed, nested = found.get(pid, (names[pid], set(), False))
            found[pid] = (names[pid], allowed | {id(h.module)}, nested or h.kernel.recurse)
    return found


def _without_inner_aliases(h: Hooked, bound: dict[int, list[int]]) -> Hooked:
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
