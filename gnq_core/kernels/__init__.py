"""Kernel paths, one module per layer family, each registered in ``registry``.

Adding a layer type: write a ``Kernel`` subclass and decorate it with ``@register(MyModule)``.
"""

from . import conv, embedding, generic, linear, norm  # noqa: F401  (importing registers them)
from .base import Contribution, Kernel, UnsupportedModuleError, hooks_suspended
from .registry import kernel_for, register

__all__ = [
    "Contribution",
    "Kernel",
    "UnsupportedModuleError",
    "hooks_suspended",
    "kernel_for",
    "register",
]
