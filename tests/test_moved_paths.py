"""Public names that moved keep their old import path for one release, with a DeprecationWarning
naming the new one (CHANGELOG.md lists them); a name that never was there still fails."""

from __future__ import annotations

import importlib

import pytest

MOVED = [  # (old module, name, new module)
    ("gnq_core.pipelines.run", "add_non_members", "gnq_core.pipelines.non_member_audit"),
    ("gnq_core.pipelines.run", "audit_non_members", "gnq_core.pipelines.non_member_audit"),
    ("gnq_core.pipelines.run", "non_members_of_audit", "gnq_core.pipelines.non_member_audit"),
]


@pytest.mark.parametrize(("old", "name", "new"), MOVED)
def test_an_old_path_warns_and_gives_the_moved_name(old, name, new):
    with pytest.warns(DeprecationWarning, match=f"{new}.{name}"):
        got = getattr(importlib.import_module(old), name)
    assert got is getattr(importlib.import_module(new), name)


@pytest.mark.parametrize("old", sorted({old for old, _, _ in MOVED}))
def test_an_unknown_name_is_still_an_attribute_error(old):
    with pytest.raises(AttributeError, match="no_such_name"):
        assert importlib.import_module(old).no_such_name is None  # never reached: it raises
