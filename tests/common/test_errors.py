"""One error hierarchy: every error class gnq_core defines for a user's mistake or an untrusted
file derives from GNQError, so one ``except GNQError`` (the CLI, a dashboard job, the pages) shows
it as one line."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import gnq_core
from gnq_core.errors import GNQError, one_line, user_errors

# Internal signals, never shown to a user: the solver's failure is caught and the batch stored as
# non-finite; a non-finite likelihood is caught by exposure() and the value stored without one.
INTERNAL = {"gnq_core.engine.math.solve.GNQNumericalError", "gnq_core.attacks.exposure_sampling.NonFinite",
            "gnq_core.sources.datasets._DuplicateKey"}  # caught inside their modules, never shown


def _error_classes() -> dict[str, type[BaseException]]:
    found = {}
    for info in pkgutil.walk_packages(gnq_core.__path__, "gnq_core."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Exception) and cls.__module__ == info.name:
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


def test_every_error_class_is_a_gnq_error():
    classes = _error_classes()
    for name in ("results.protected_paths.OverwriteError", "sources.checkpoints.series.SeriesError",
                 "sources.tokenizer_panics.TokenizerFailure", "pipelines.finite_share.NumericalFailureError",
                 "engine.kernels.base.UnsupportedModuleError"):
        assert f"gnq_core.{name}" in classes
    outside = sorted(n for n, cls in classes.items() if not issubclass(cls, GNQError) and n not in INTERNAL)
    assert outside == []


def test_a_gnq_error_is_one_line_and_a_user_error():
    from gnq_core.sources.checkpoints.series import SeriesError

    exc = SeriesError("a: b\nmore")
    assert isinstance(exc, user_errors()) and isinstance(exc, ValueError)  # `except ValueError` still holds
    assert one_line(exc) == "a: b"
