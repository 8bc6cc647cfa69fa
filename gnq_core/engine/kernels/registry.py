"""Which kernel handles which module type (extension point: ``@register(MyModule)``)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from gnq_core.engine.kernels.base import Kernel

_KERNELS: dict[type, Kernel] = {}
_generic: Kernel | None = None


def register(*module_types: type) -> Callable[[type[Kernel]], type[Kernel]]:
    """Class decorator: use this kernel for modules of these exact types.

    A kernel with a fused path declares it with ``fusable = True`` and ``fused_forward``
    (like Opacus registers one grad-sampler per layer type, the auditor asks the registry).
    """

    def deco(cls: type[Kernel]) -> type[Kernel]:
        instance = cls()
        for t in module_types:
            _KERNELS[t] = instance
        return cls

    return deco


def register_generic(cls: type[Kernel]) -> type[Kernel]:
    global _generic
    _generic = cls()
    return cls


def kernel_for(module: nn.Module) -> Kernel:
    """The registered kernel for the module's type; a subclass inherits it only if it keeps
    its base's forward (a LoRA layer that subclasses Linear does not compute x Wᵀ + b)."""
    t = type(module)
    if t in _KERNELS:
        return _KERNELS[t]
    for base in t.__mro__[1:]:
        if base in _KERNELS and getattr(t, "forward", None) is getattr(base, "forward", None):
            return _KERNELS[base]
    return generic_kernel()


def can_fuse(module: nn.Module) -> bool:
    """Whether the module's kernel declares a fused path (``Kernel.fusable``)."""
    return kernel_for(module).fusable


def generic_kernel() -> Kernel:
    """The fallback kernel (per-example vjp of a module's forward)."""
    assert _generic is not None, "generic kernel not registered"
    return _generic


def refusal(module: nn.Module) -> str | None:
    """The first reason a registered kernel gives for refusing ``module`` (``Kernel.refusal``): asked
    of every kernel, not only the module's own, since a subclass with its own forward falls back to
    the generic kernel but can still couple the examples of a batch (BatchNorm in train mode)."""
    kernels = [*dict.fromkeys(_KERNELS.values()), *([_generic] if _generic is not None else [])]
    return next((why for k in kernels if (why := k.refusal(module))), None)
