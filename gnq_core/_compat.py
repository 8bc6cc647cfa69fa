"""Old import paths, kept for one release: importing one warns once (DeprecationWarning) and gives
the module at its new path, the very same module object.

A finder on ``sys.meta_path`` rather than a stub file per old path, so a moved module keeps a single
file (git follows the move) and ``import gnq_core.auditor`` and ``from gnq_core.distributed import
DistributedGNQAuditor`` both keep working.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED: dict[str, str] = {  # old path -> new path
    # the package layout of 0.1 (engine/sources/results/pipelines/analysis)
    "gnq_core.auditor": "gnq_core.engine.auditor",
    "gnq_core.coverage": "gnq_core.engine.coverage",
    "gnq_core.losses": "gnq_core.engine.losses",
    "gnq_core.reference": "gnq_core.engine.reference",
    "gnq_core.solve": "gnq_core.engine.solve",
    "gnq_core.selfcheck": "gnq_core.engine.selfcheck",
    "gnq_core.kernels": "gnq_core.engine.kernels",
    "gnq_core.distributed": "gnq_core.engine.distributed",
    "gnq_core.hf_callback": "gnq_core.pipelines.hf_callback",
    "gnq_core.checkpoints": "gnq_core.sources.checkpoints",
    "gnq_core.datasets": "gnq_core.sources.datasets",
    "gnq_core.store": "gnq_core.results.store",
    "gnq_core.shards": "gnq_core.results.shards",
    "gnq_core.export": "gnq_core.results.export",
    # issue 29: the distributed auditor in the engine, the studies beside the CLI
    "gnq_core.pipelines.distributed": "gnq_core.engine.distributed",
    "gnq_core.analysis.studies": "gnq_core.studies",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path=None, target=None):  # noqa: ANN001, ARG002
        new = self._target(fullname)
        return None if new is None else importlib.machinery.ModuleSpec(fullname, self)

    @staticmethod
    def _target(fullname: str) -> str | None:
        for old, new in MOVED.items():
            if fullname == old or fullname.startswith(old + "."):
                return new + fullname[len(old):]
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = self._target(spec.name)
        if spec.name in MOVED:
            warnings.warn(f"{spec.name} moved to {new}; the old path goes in the next release",
                          DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the module at its new path is already executed


def install() -> None:
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())
