"""Public names that moved keep their old import path for one release, with a DeprecationWarning
naming the new one (CHANGELOG.md lists them); a name that never was there still fails."""

from __future__ import annotations

import importlib

import pytest

MOVED = [  # (old module, name, new module)
    ("gnq_core.pipelines.run", "add_non_members", "gnq_core.pipelines.non_member_audit"),
    ("gnq_core.pipelines.run", "audit_non_members", "gnq_core.pipelines.non_member_audit"),
    ("gnq_core.pipelines.run", "non_members_of_audit", "gnq_core.pipelines.non_member_audit"),
    ("gnq_core.results.text_labels", "text_labels", "gnq_core.sources.text_labels"),
    ("gnq_core.results.text_labels", "dataset_labels", "gnq_core.sources.text_labels"),
    ("gnq_core.results.text_labels", "secret_settings", "gnq_core.sources.text_labels"),
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


def test_a_new_run_is_labelled_where_it_is_made():
    """The labels of a new run are computed where the audit and the training run (from
    sources/text_labels.py) and only stored by results/; results/text_labels.py keeps the fill-in
    for a run stored without them, from its stored texts."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "gnq_core"

    def imported(path: Path) -> set[str]:
        return {f"{n.module}.{a.name}" for n in ast.walk(ast.parse(path.read_text()))
                if isinstance(n, ast.ImportFrom) and n.module for a in n.names}

    for job in ("audit", "train"):
        assert "gnq_core.sources.text_labels.dataset_labels" in imported(root / "pipelines" / f"{job}.py")
    assert imported(root / "results" / "text_labels.py") & {
        "gnq_core.sources.text_labels.dataset_labels", "gnq_core.sources.text_labels.text_labels"} == set()
