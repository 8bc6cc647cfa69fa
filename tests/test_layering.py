"""The layers of docs/DESIGN.md §5, enforced on every import statement (also those inside functions):
engine < sources < results < pipelines < analysis < studies, cli < app.  Every package is covered;
nothing below the CLI runs the CLI as a program; the app imports only the packages' facades, whose
``__all__`` names exist."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ABOVE = {  # package -> what it must not import
    "gnq_core.engine": ("sources", "results", "pipelines", "analysis", "studies", "cli", "app"),
    "gnq_core.sources": ("results", "pipelines", "analysis", "studies", "cli", "app"),
    "gnq_core.results": ("pipelines", "analysis", "studies", "cli", "app"),
    "gnq_core.pipelines": ("analysis", "studies", "cli", "app"),
    "gnq_core.analysis": ("pipelines", "studies", "cli", "app"),  # pure frame/figure functions
    "gnq_core.studies": ("cli", "app"),
    "gnq_core.cli": ("app",),
    "gnq_core": ("app",),
}
# What the app may import from gnq_core: the facades (each package's public API) and access.py.
FACADES = ("gnq_core", "gnq_core.engine", "gnq_core.sources", "gnq_core.results", "gnq_core.pipelines",
           "gnq_core.analysis", "gnq_core.studies", "gnq_core.access")


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) for every import in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, [a.name for a in node.names], node.lineno))
    return found


def packages() -> list[str]:
    folders = [ROOT / "gnq_core", *(ROOT / "gnq_core").glob("*/")]
    return sorted(".".join(p.relative_to(ROOT).parts) for p in folders if (p / "__init__.py").exists())


def test_every_package_has_its_layer():
    missing = [p for p in packages() if p not in ABOVE]
    assert not missing, f"packages without a layer in ABOVE: {missing}"


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


SPAWNS = {"Popen", "run", "call", "check_call", "check_output", "system", "execv", "execvp", "execvpe",
          "create_subprocess_exec", "create_subprocess_shell"}


def cli_runs(path: Path) -> list[int]:
    """Lines where a process is started with the CLI as its program: 'gnq_core.cli' (python -m) or 'gnq'."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        func = getattr(node, "func", None)
        if isinstance(node, ast.Call) and getattr(func, "attr", getattr(func, "id", None)) in SPAWNS:
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                for leaf in ast.walk(arg):
                    if isinstance(leaf, ast.Constant) and leaf.value in ("gnq_core.cli", "gnq"):
                        found.append(leaf.lineno)
    return found


def test_nothing_below_the_cli_runs_the_cli():
    """A dependency that points up without an import (a subprocess of `gnq`) is one all the same."""
    cli = ROOT / "gnq_core" / "cli"
    below = [path for path in sorted((ROOT / "gnq_core").rglob("*.py")) if cli not in path.parents]
    bad = [f"{path.relative_to(ROOT)}:{line} runs the CLI" for path in below for line in cli_runs(path)]
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


def test_app_imports_only_facades():
    bad = [f"{path.relative_to(ROOT)}:{line} imports {module}, not a facade"
           for path in sorted((ROOT / "app").rglob("*.py")) for module, _, line in imports(path)
           if module.split(".")[0] == "gnq_core" and module not in FACADES]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("facade", FACADES)
def test_a_facade_names_its_api_and_every_name_exists(facade):
    module = importlib.import_module(facade)
    names = getattr(module, "__all__", None)
    assert names, f"{facade} has no __all__"
    assert not [n for n in names if not hasattr(module, n)], f"{facade}.__all__ names what it lacks"


def test_the_checks_see_a_violation(tmp_path):
    """The walk above finds imports inside functions too (a lazy import is still a dependency), and
    a CLI run given as a list of arguments."""
    sample = tmp_path / "m.py"
    sample.write_text("def f():\n    from gnq_core.results.store import _insert_run\n"
                      "    subprocess.Popen([sys.executable, '-m', 'gnq_core.cli', 'job'])\n")
    assert imports(sample) == [("gnq_core.results.store", ["_insert_run"], 2)]
    assert cli_runs(sample) == [3]


def test_a_modules_all_lists_every_public_name_others_import_from_it():
    """``__all__`` is the module's public API: a name another module imports from it is listed."""
    declared = {}
    for path in sorted((ROOT / "gnq_core").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            targets = [getattr(t, "id", None) for t in getattr(node, "targets", [])]
            if isinstance(node, ast.Assign) and "__all__" in targets and isinstance(node.value, ast.List):
                module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                declared[module] = {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    bad = []
    for path in sorted([*(ROOT / "gnq_core").rglob("*.py"), *(ROOT / "app").rglob("*.py")]):
        for module, names, line in imports(path):
            lacking = [n for n in names if module in declared and not n.startswith("_")
                       and n not in declared[module] and not (ROOT / module.replace(".", "/") / n).exists()
                       and not (ROOT / module.replace(".", "/") / f"{n}.py").exists()]
            if lacking:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {', '.join(lacking)} from {module}, "
                           "not in its __all__")
    assert not bad, "\n".join(bad)
