"""The layers of docs/DESIGN.md §5, enforced on every import statement (also those inside functions):
engine < sources < results < pipelines, analysis < cli < app; app uses gnq_core's public names only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ABOVE = {  # package -> what it must not import
    "gnq_core.engine": ("sources", "results", "pipelines", "analysis", "cli", "app"),
    "gnq_core.sources": ("results", "pipelines", "analysis", "cli", "app"),
    "gnq_core.results": ("pipelines", "analysis", "cli", "app"),
    "gnq_core.pipelines": ("analysis", "cli", "app"),
    "gnq_core": ("app",),
}


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) for every import in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, [a.name for a in node.names], node.lineno))
    return found


@pytest.mark.parametrize("package", list(ABOVE))
def test_no_layer_imports_a_layer_above_it(package):
    folder = ROOT.joinpath(*package.split("."))
    bad = []
    for path in sorted(folder.rglob("*.py")):
        for module, _, line in imports(path):
            for above in ABOVE[package]:
                target = above if above == "app" else f"gnq_core.{above}"
                if module == target or module.startswith(target + "."):
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not bad, "\n".join(bad)


def test_app_uses_only_public_names_of_gnq_core():
    bad = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        for module, names, line in imports(path):
            if module.split(".")[0] != "gnq_core":
                continue
            private = [p for p in module.split(".") + names if p.startswith("_")]
            if private:
                bad.append(f"{path.relative_to(ROOT)}:{line} uses {module}: {', '.join(private)}")
    assert not bad, "\n".join(bad)


def test_the_checks_see_a_violation(tmp_path):
    """The walk above finds imports inside functions too (a lazy import is still a dependency)."""
    sample = tmp_path / "m.py"
    sample.write_text("def f():\n    from gnq_core.results.store import _insert_run\n")
    assert imports(sample) == [("gnq_core.results.store", ["_insert_run"], 2)]
