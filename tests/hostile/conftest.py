"""Fixtures shared by the hostile suite."""

from __future__ import annotations

import pytest
from zygote import Zygote


@pytest.fixture(scope="session")
def zygote(tmp_path_factory):
    """Starts `gnq` jobs as processes in moments (zygote.py): one per session, its imports done once."""
    zygote = Zygote(tmp_path_factory.mktemp("zygote"))
    yield zygote
    zygote.close()
