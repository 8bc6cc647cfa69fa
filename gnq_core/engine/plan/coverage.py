"""What the auditor covers, by which path, and a check that nothing escapes it.

Hooks see a parameter only through the forward of a module that owns it.  A parameter that
some other code uses directly (``F.linear(x, self.child.weight)`` in a parent) would add
gradient the kernel never sees, so GNQ would silently be wrong.  ``UseChecker`` watches the
first forward pass with a TorchFunctionMode and names every such parameter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from gnq_core.errors import GNQError


class UncoveredParametersError(GNQError, RuntimeError):
    """Trainable parameters whose gradients the auditor cannot attribute per example."""

    def __init__(self, uses: dict[str, str]):
        self.parameters = sorted(uses)
        lines = ", ".join(f"{p} (used in {where})" for p, where in sorted(uses.items()))
        super().__init__(
            f"GNQAuditor cannot cover {len(uses)} trainable parameter(s) used outside the forward "
            f"of a module that owns them: {lines}. Move the computation into the owning module, "
            "or freeze the parameter (requires_grad=False)."
        )


@dataclass
class CoverageEntry:
    module: str  # qualified name in the model ("" for the root)
    module_type: str
    kernel: str
    parameters: list[str]
    numel: int
    paths: set[str] = field(default_factory=set)  # e.g. {"ghost"}, {"materialize", "tied"}
    calls: int = 0


@dataclass
class Coverage:
    """Every trainable parameter of the model, the module that covers it and how."""

    entries: list[CoverageEntry]
    trainable_numel: int
    covered_numel: int  # tied parameters count once

    def paths(self) -> dict[str, set[str]]:
        return {e.module: set(e.paths) for e in self.entries}

    def __str__(self) -> str:
        lines = [f"{'module':40s} {'type':22s} {'kernel':14s} {'params':>10s} {'path':s}"]
        for e in self.entries:
            path = ",".join(sorted(e.paths)) or "(not used)"
            lines.append(f"{e.module or '<root>':40s} {e.module_type:22s} {e.kernel:14s} "
                         f"{e.numel:>10,d} {path}")
        lines.append(f"covered {self.covered_numel:,} of {self.trainable_numel:,} trainable "
                     "parameters")
        return "\n".join(lines)


class UseChecker(TorchFunctionMode):
    """Records differentiable uses of watched parameters outside their owners' forward."""

    def __init__(self, model: nn.Module, owners: dict[int, tuple[str, set[int], bool]]):
        # owners: id(param) -> (param name, ids of modules allowed to use it, nested_ok)
        super().__init__()
        self._owners = owners
        self._stack: list[int] = []
        self._names = {id(m): n or "<root>" for n, m in model.named_modules()}
        self._qualified = {id(m): n for n, m in model.named_modules()}
        self.violations: dict[str, str] = {}
        self.users: dict[str, str | None] = {}  # parameter -> innermost module using it (None: no module)
        self.done = False  # set once one forward pass has been watched
        self._handles = []
        for m in model.modules():
            self._handles.append(m.register_forward_pre_hook(self._push))
            self._handles.append(m.register_forward_hook(self._pop, always_call=True))

    def _push(self, module, args):
        self._stack.append(id(module))

    def _pop(self, module, args, output):
        if self._stack and self._stack[-1] == id(module):
            self._stack.pop()

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if torch.is_grad_enabled() and _differentiable(out):
            for leaf in tree_flatten((args, kwargs))[0]:
                if isinstance(leaf, nn.Parameter) and id(leaf) in self._owners and leaf.requires_grad:
                    self._check(leaf)
        return out

    def _check(self, param: nn.Parameter) -> None:
        name, allowed, nested_ok = self._owners[id(param)]
        inner = self._stack[-1] if self._stack else None
        if inner in allowed or (nested_ok and any(m in allowed for m in self._stack)):
            return
        where = self._names.get(inner, "code outside any module") if inner else "code outside any module"
        self.violations.setdefault(name, f"the forward of '{where}'")
        self.users.setdefault(name, self._qualified.get(inner) if inner else None)


def _differentiable(out) -> bool:
    """Only uses that carry gradient matter (``weight.dim()`` or ``.shape`` do not)."""
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in tree_flatten(out)[0])
