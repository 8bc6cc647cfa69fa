"""Modules that moved, importable by their old paths for one release.

``import gnq_core.engine.solve`` (or ``from gnq_core.progress import ...``) still works and gives
the module at its new path, with a DeprecationWarning naming that path: code written against the
previous layout keeps running while its imports are updated.  A finder on ``sys.meta_path``
answers only the old names listed here; every other import is left to Python's own finders.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

_ENGINE = "gnq_core.engine"
_WINGS = {
    "plan": ("planning", "plan_reuse", "assignment", "coverage", "frontier", "compiled", "batch"),
    "passes": ("micro", "window", "window_ddp", "distributed", "hooks", "pass_state", "first_batch",
               "recompute", "extension_points", "fused_sink"),
    "math": ("grams", "solve", "representations", "tolerance", "reference", "cpu_gram", "losses",
             "cost_model", "conventions"),
    "kernels": ("fused", "deferred"),
}
MOVED: dict[str, str] = {
    **{f"{_ENGINE}.{m}": f"{_ENGINE}.{wing}.{m}" for wing, modules in _WINGS.items() for m in modules},
    f"{_ENGINE}.companions": f"{_ENGINE}.sketch.companions",
    **{f"gnq_core.{m}": f"gnq_core.common.{m}"
       for m in ("progress", "runtime", "terminal", "interrupts", "atomic", "values")},
    "gnq_core.usage_errors": "gnq_core.cli.usage_errors",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a placeholder, replaced in sys.modules by the module at its new path

    def exec_module(self, module: ModuleType) -> None:
        old = module.__name__
        warnings.warn(f"{old} moved to {self.new}; import it from there (the old path goes in the next "
                      f"release)", DeprecationWarning, stacklevel=_caller_level())
        sys.modules[old] = importlib.import_module(self.new)  # the import system returns this entry


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        return importlib.machinery.ModuleSpec(fullname, _Alias(new)) if new else None


def _caller_level() -> int:
    """The warning's stack level: the first frame outside the import system and this module."""
    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_code.co_filename == __file__
                                 or frame.f_code.co_filename.startswith("<frozen importlib")):
        frame, level = frame.f_back, level + 1
    return level


def install() -> None:
    """Answer the old paths from now on (once per process)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
