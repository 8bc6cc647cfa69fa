"""Shared test helpers: float64 by default, error measures, tiny models built from config."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

# tests/ mirrors gnq_core (tests/engine/, tests/sources/, ..., tests/e2e/, tests/hostile/).  The
# helpers here (lm_fixtures.py, ...) and a few test modules' own helpers (test_store's rows,
# test_distributed's torchrun) are imported by plain module name from other folders, so every folder
# is on sys.path from the start, whichever file is run alone.
_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(p) for p in sorted(_HERE.iterdir()) if p.is_dir() and not p.name.startswith((".", "_"))
                and str(p) not in sys.path]


@pytest.fixture(autouse=True)
def float64_default():
    """Kernel paths are compared with the reference in float64 (rel. error ≤ 1e-9)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


_THREADS = torch.get_num_threads()  # torch's default in a fresh process, as a `gnq` subprocess has


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """An in-process `gnq ... --threads 1` sets torch's threads for the whole process (as a command
    should).  Set back when a module's last test and its fixtures are torn down, so the next
    module's fixtures run with torch's default too: an in-process run and a `gnq` subprocess then
    reduce in the same order and compare bit for bit.  Not between tests of one module: a module
    may hold one thread for all its tests on purpose (the family matrix)."""
    yield
    if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
        torch.set_num_threads(_THREADS)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max_j |a_j − b_j| / max(|b_j|, tiny): elementwise relative error."""
    a, b = a.to(torch.float64), b.to(torch.float64)
    return ((a - b).abs() / b.abs().clamp_min(1e-300)).max().item()


def kernel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative error of a B×B kernel, normalised by its largest entry."""
    a, b = a.to(torch.float64), b.to(torch.float64)
    return ((a - b).abs().max() / b.abs().max()).item()


TOL = 1e-9
PATHS = ["auto", "ghost", "materialize"]


# The hostile suite's zygote (tests/hostile/zygote.py). Its hooks live here, not in a
# tests/hostile/conftest.py: test modules import helpers with `from conftest import ...`, and a
# second conftest module would take that name for the whole run.
_early_zygotes: list = []


def _new_zygote():
    import tempfile

    from zygote import Zygote  # tests/hostile is on sys.path once a hostile test is collected

    return Zygote(Path(tempfile.mkdtemp(prefix="gnq-zygote-")))


def pytest_collection_finish(session: pytest.Session) -> None:
    """When a selected test will use the zygote, start it now: it imports while the first tests run."""
    if any("zygote" in getattr(item, "fixturenames", ()) for item in session.items):
        _early_zygotes.append(_new_zygote())


@pytest.fixture(scope="session")
def zygote():
    """Starts `gnq` jobs as processes in moments (zygote.py): one per session, its imports done once."""
    import shutil

    zygote = _early_zygotes.pop() if _early_zygotes else _new_zygote()
    yield zygote
    zygote.close()
    shutil.rmtree(zygote.folder, ignore_errors=True)


def pytest_sessionfinish(session: pytest.Session) -> None:  # noqa: ARG001
    """A zygote started early whose tests were all skipped."""
    import shutil

    while _early_zygotes:
        zygote = _early_zygotes.pop()
        zygote.close()
        shutil.rmtree(zygote.folder, ignore_errors=True)


# FutureWarning / DeprecationWarning from gnq_core's own call sites fail the test (own_warnings.py).
def pytest_configure(config: pytest.Config) -> None:  # noqa: ARG001
    import own_warnings

    own_warnings.install()


def _fail_on_own_warnings(phase: str):
    import own_warnings

    own_warnings.take()  # a previous phase's, already reported
    result = yield
    seen = own_warnings.take()
    if seen:
        pytest.fail(f"deprecated API called by our code during {phase} (fix the call site):\n  "
                    + "\n  ".join(seen), pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):  # noqa: ARG001
    return (yield from _fail_on_own_warnings("setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):  # noqa: ARG001
    return (yield from _fail_on_own_warnings("the test"))
