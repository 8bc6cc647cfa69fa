"""A package's public names, imported on first use (PEP 562): ``import gnq_core`` and the facades
stay cheap (no torch, transformers or duckdb until a name that needs them is used)."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, tuple[str, ...]]
                 ) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` for ``package`` from {module: names}; a module
    name relative to the package starts with a dot.  A name that is a module of its own (e.g.
    ``predictive``) is listed under the package itself ("")."""
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if module == "":
            return importlib.import_module(f"{package}.{name}")
        # resolved at each use, not cached: a test that patches the module is seen through the facade
        return getattr(importlib.import_module(module, package), name)

    def __dir__() -> list[str]:
        return sorted(where)

    return sorted(where), __getattr__, __dir__


def moved_names(module: str, new: str, names: tuple[str, ...]) -> Callable[[str], Any]:
    """``__getattr__`` for ``module`` whose ``names`` moved to ``new``: each still given, with a
    DeprecationWarning naming its new path (for one release)."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} moved to {new}.{name}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new), name)

    return __getattr__
