"""Kernel paths, one module per layer family, each registered in ``registry``.

Adding a layer type: write a ``Kernel`` subclass and decorate it with ``@register(MyModule)``.
"""

from gnq_core.engine.kernels import conv, embedding, generic, linear, norm  # noqa: F401  (importing registers them)
from gnq_core.engine.kernels.base import Contribution, Kernel, UnsupportedModuleError, hooks_suspended
from gnq_core.engine.kernels.registry import can_fuse, kernel_for, register

__all__ = [
    "Contribution",
    "Kernel",
    "UnsupportedModuleError",
    "can_fuse",
    "hooks_suspended",
    "kernel_for",
    "register",
]
