"""Fixtures shared by the hostile suite."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from zygote import Zygote

_early: list[Zygote] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    """When a selected test will use the zygote, start it now: it imports while the first tests run."""
    if any("zygote" in getattr(item, "fixturenames", ()) for item in session.items):
        _early.append(Zygote(Path(tempfile.mkdtemp(prefix="gnq-zygote-"))))


@pytest.fixture(scope="session")
def zygote():
    """Starts `gnq` jobs as processes in moments (zygote.py): one per session, its imports done once."""
    zygote = _early.pop() if _early else Zygote(Path(tempfile.mkdtemp(prefix="gnq-zygote-")))
    yield zygote
    zygote.close()
    shutil.rmtree(zygote.folder, ignore_errors=True)


def pytest_sessionfinish(session: pytest.Session) -> None:  # noqa: ARG001
    """A zygote started early whose tests were all skipped."""
    while _early:
        zygote = _early.pop()
        zygote.close()
        shutil.rmtree(zygote.folder, ignore_errors=True)
