"""The layers of docs/DESIGN.md §5, enforced on every import statement (also those inside
functions): common, catalog < engine < sources < results < attacks < pipelines < integrations, jobs,
analysis < cli < dashboard (the catalog, the facts of every secret kind and per-text signal, is a
bottom floor: it imports no other package and no torch; common, what every layer shares, imports
only gnq_core.errors).  Inside the engine, its wings: math < sketch < kernels < plan < passes <
the auditor.  Every
package is covered; nothing below the CLI runs the CLI as a program; nothing in gnq_core imports the dashboard
(``gnq dashboard`` starts it by file path); the dashboard imports only the packages' facades, whose
``__all__`` names exist.  The studies (research/, not installed; ``python -m research``) import
gnq_core's public names, and nothing in gnq_core imports them (the deprecated ``gnq study``
forwarder finds the program by name, cli/studies.py).  Inside a
package, module-level imports form no cycle, and neither new cycles through imports inside
functions nor private names imported across modules appear."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ABOVE = {  # package -> what it must not import
    "gnq_core.common": ("catalog", "engine", "sources", "results", "attacks", "pipelines", "integrations",
                        "jobs", "analysis", "cli", "dashboard"),
    "gnq_core.catalog": ("engine", "sources", "results", "attacks", "pipelines", "integrations", "jobs",
                         "analysis", "cli", "dashboard"),
    "gnq_core.engine": ("sources", "results", "attacks", "pipelines", "integrations", "jobs", "analysis",
                        "cli", "dashboard"),
    "gnq_core.sources": ("results", "attacks", "pipelines", "integrations", "jobs", "analysis", "cli",
                         "dashboard"),
    "gnq_core.results": ("attacks", "pipelines", "integrations", "jobs", "analysis", "cli", "dashboard"),
    "gnq_core.attacks": ("pipelines", "integrations", "jobs", "analysis", "cli", "dashboard"),
    "gnq_core.pipelines": ("integrations", "jobs", "analysis", "cli", "dashboard"),
    "gnq_core.integrations": ("jobs", "analysis", "cli", "dashboard"),  # the trainers, on the pipelines
    "gnq_core.jobs": ("integrations", "analysis", "cli", "dashboard"),  # background jobs (the CLI's too)
    "gnq_core.analysis": ("attacks", "pipelines", "integrations", "jobs", "cli", "dashboard"),  # pure frames
    "gnq_core.cli": ("dashboard",),  # `gnq dashboard` starts it by file path, never by import
    "gnq_core.dashboard": (),  # the top layer
    "gnq_core": ("dashboard",),
}
# The dashboard: the package and the checkout's entry file (app/main.py).
DASHBOARD = ("gnq_core/dashboard", "app")
# What the dashboard may import from the rest of gnq_core: the facades (public APIs) and access.py.
FACADES = ("gnq_core", "gnq_core.catalog", "gnq_core.engine", "gnq_core.sources", "gnq_core.results",
           "gnq_core.attacks", "gnq_core.pipelines", "gnq_core.jobs", "gnq_core.analysis", "gnq_core.access")


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
        own = module_name(path)
        for module, _, line in imports(path):
            for above in ABOVE[package]:
                target = f"gnq_core.{above}"
                inside = own == target or own.startswith(target + ".")  # gnq_core's folder holds them all
                if not inside and (module == target or module.startswith(target + ".")):
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not bad, "\n".join(bad)


def test_the_catalog_imports_no_torch_and_nothing_of_gnq_core_but_itself():
    """The bottom floor: every layer reads the catalog, so it must load without torch or numpy's
    consumers (a report, the dashboard's captions) and without any other package of gnq_core."""
    bad = [f"{path.relative_to(ROOT)}:{line} imports {module}"
           for path in sorted((ROOT / "gnq_core" / "catalog").rglob("*.py"))
           for module, _, line in imports(path)
           if module.split(".")[0] in ("torch", "transformers", "numpy", "pandas")
           or (module.startswith("gnq_core") and not module.startswith("gnq_core.catalog"))]
    assert not bad, "\n".join(bad)


def names_research(path: Path) -> bool:
    """Whether a file names a module of research/ (an import by name, a dotted path in a string)."""
    return re.search(r"\bresearch\.[a-z_]", path.read_text()) is not None


def test_nothing_installed_imports_the_research():
    """research/ is not installed: an import of it from gnq_core or the app would fail on a user's
    machine.  The studies are their own program, ``python -m research``; the deprecated ``gnq
    study`` forwarder (cli/studies.py, to be removed in the next release: CHANGELOG) is the one place
    that names it, imports it by name at run time and says in one line where the studies are when
    they are not there."""
    bad = [f"{path.relative_to(ROOT)}:{line} imports {module}"
           for top in ("gnq_core", "app") for path in sorted((ROOT / top).rglob("*.py"))
           for module, _, line in imports(path) if module.split(".")[0] == "research"]
    assert not bad, "\n".join(bad)
    naming = sorted(str(p.relative_to(ROOT)) for top in ("gnq_core", "app")
                    for p in (ROOT / top).rglob("*.py") if names_research(p))
    assert naming == ["gnq_core/cli/studies.py"]


def test_the_research_check_sees_a_name_in_a_string(tmp_path):
    sample = tmp_path / "m.py"
    sample.write_text('importlib.import_module("research.studies.base")\n')
    assert names_research(sample)
    sample.write_text('"""the research behind it; research/ is not installed."""\n')
    assert not names_research(sample)


def test_the_research_uses_only_public_names_of_gnq_core():
    bad = []
    for path in sorted((ROOT / "research").rglob("*.py")):
        for module, names, line in imports(path):
            private = [p for p in module.split(".") + names if p.startswith("_")]
            if module.split(".")[0] == "gnq_core" and private:
                bad.append(f"{path.relative_to(ROOT)}:{line} uses {module}: {', '.join(private)}")
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


def dashboard_files() -> list[Path]:
    return sorted(p for folder in DASHBOARD for p in (ROOT / folder).rglob("*.py"))


def outside_dashboard(module: str) -> bool:
    """A gnq_core module that is not the dashboard's own."""
    return module.split(".")[0] == "gnq_core" and not module.startswith("gnq_core.dashboard")


def test_dashboard_uses_only_public_names_of_gnq_core():
    bad = []
    for path in dashboard_files():
        for module, names, line in imports(path):
            if not outside_dashboard(module):
                continue
            private = [p for p in module.split(".") + names if p.startswith("_")]
            if private:
                bad.append(f"{path.relative_to(ROOT)}:{line} uses {module}: {', '.join(private)}")
    assert not bad, "\n".join(bad)


def test_dashboard_imports_only_facades():
    bad = [f"{path.relative_to(ROOT)}:{line} imports {module}, not a facade"
           for path in dashboard_files() for module, _, line in imports(path)
           if outside_dashboard(module) and module not in FACADES]
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


# ---------------------------------------------------------------- cycles and private names
def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return getattr(test, "id", getattr(test, "attr", None)) == "TYPE_CHECKING"


def _import_nodes(tree: ast.Module, module_level: bool) -> list[ast.Import | ast.ImportFrom]:
    """The imports a module runs: at module level (in ``if``/``try`` too, not under ``if
    TYPE_CHECKING:``), or everywhere (functions too) when ``module_level`` is False."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            todo += node.orelse if _type_checking(node) else node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
        elif not module_level:
            todo += [c for c in ast.iter_child_nodes(node)
                     if isinstance(c, ast.stmt | ast.excepthandler | ast.match_case)]
    return found


def module_graph(files: dict[str, Path], module_level: bool = True
                 ) -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """Edges module -> the modules of ``files`` it imports, and (importer, name, module) for every
    private name (one leading underscore) imported from another module.  ``from pkg import sub``
    of a submodule is an import of ``sub`` (the package itself is imported first by any import of
    its submodules, so that is no edge of its own)."""
    edges: dict[str, set[str]] = {m: set() for m in files}
    private = []
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in _import_nodes(ast.parse(path.read_text(), str(path)), module_level):
            if isinstance(node, ast.Import):
                edges[module].update(a.name for a in node.names if a.name in files)
                continue
            target = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            names = [a.name for a in node.names]
            subs = {n for n in names if f"{target}.{n}" in files}
            edges[module].update(f"{target}.{n}" for n in subs)
            if target in files and len(subs) < len(names):
                edges[module].add(target)
            if target in files:
                private += [(module, n, target) for n in names
                            if n.startswith("_") and not n.startswith("__") and n not in subs]
    for module in edges:
        edges[module].discard(module)
    return edges, private


def package_of(module: str) -> str:
    """gnq_core.<package> (its subpackages included), gnq_core's own modules, app or research."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "gnq_core" and len(parts) > 2 else parts[0]


def cycles_inside_packages(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The import cycles whose modules are all in one package (strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if package_of(w) != package_of(v):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while not component or v not in component:
                component.add(stack.pop())
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def source_files(root: Path = ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for top in ("gnq_core", "app", "research")
            for p in sorted((root / top).rglob("*.py"))}


# Cycles through imports inside functions, which hide them from Python's own import.  The
# five found when the packages were split into layers (extraction <-> secret_attack,
# length_control <-> predictive, html_report <-> run_report, demo -> jobs -> run,
# common_knowledge <-> common_knowledge_real) are gone, each by moving the
# shared piece to a module both import.  An entry here lets a known one stay until it is split;
# an entry that no longer is a cycle fails the test: delete it then.
KNOWN_FUNCTION_LEVEL_CYCLES: set[frozenset[str]] = set()

# Private names imported from another module: none (a helper two modules share is a public name of
# the module that owns it).  An entry here, by importer and the module it comes from, would let a
# known one stay; a new one fails the test, and so does an entry no longer imported.
KNOWN_PRIVATE_IMPORTS: dict[tuple[str, str], set[str]] = {}


def test_no_import_cycle_inside_a_package():
    """Module-level imports (what Python runs on import) form no cycle inside any package."""
    edges, _ = module_graph(source_files())
    found = cycles_inside_packages(edges)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in found)


def test_no_new_import_cycle_through_function_level_imports():
    edges, _ = module_graph(source_files(), module_level=False)
    found = set(cycles_inside_packages(edges))
    new = [" <-> ".join(sorted(c)) for c in found - KNOWN_FUNCTION_LEVEL_CYCLES]
    gone = [" <-> ".join(sorted(c)) for c in KNOWN_FUNCTION_LEVEL_CYCLES - found]
    assert not new, "import cycles (through imports inside functions): " + "; ".join(new)
    assert not gone, "no longer cycles, delete from KNOWN_FUNCTION_LEVEL_CYCLES: " + "; ".join(gone)


def test_no_new_private_name_imported_across_modules():
    _, private = module_graph(source_files(), module_level=False)
    found: dict[tuple[str, str], set[str]] = {}
    for importer, name, module in private:
        found.setdefault((importer, module), set()).add(name)
    new = [f"{i} imports {', '.join(sorted(n - KNOWN_PRIVATE_IMPORTS.get((i, m), set())))} from {m}"
           for (i, m), n in sorted(found.items()) if n - KNOWN_PRIVATE_IMPORTS.get((i, m), set())]
    gone = [f"{i}: {', '.join(sorted(n - found.get((i, m), set())))} from {m}"
            for (i, m), n in sorted(KNOWN_PRIVATE_IMPORTS.items()) if n - found.get((i, m), set())]
    assert not new, "private names imported from another module:\n" + "\n".join(new)
    assert not gone, "no longer imported, delete from KNOWN_PRIVATE_IMPORTS:\n" + "\n".join(gone)


def test_the_cycle_and_private_checks_see_a_violation(tmp_path):
    """A cycle only at module level is one (a TYPE_CHECKING import is not), one through a function
    only without ``module_level``; a submodule imported from its package is no edge to the
    package; a private name from another module is found, from a relative import too."""
    pkg = tmp_path / "gnq_core" / "p"
    pkg.mkdir(parents=True)
    (tmp_path / "gnq_core" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from gnq_core.p.a import f\n")
    (pkg / "a.py").write_text("from gnq_core.p import b\n\ndef f():\n    from gnq_core.p.c import g\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from gnq_core.p.a import f\nfrom gnq_core.p.c import _h\n")
    (pkg / "c.py").write_text("try:\n    from .a import f\nexcept ImportError:\n    pass\n")
    (tmp_path / "app").mkdir()
    files = source_files(tmp_path)
    edges, private = module_graph(files)
    assert edges["gnq_core.p.a"] == {"gnq_core.p.b"}  # not the package gnq_core.p
    assert cycles_inside_packages(edges) == [frozenset({"gnq_core.p.a", "gnq_core.p.b", "gnq_core.p.c"})]
    assert private == [("gnq_core.p.b", "_h", "gnq_core.p.c")]
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from gnq_core.p.a import f\n")
    (pkg / "c.py").write_text("")
    (pkg / "d.py").write_text("def f():\n    from gnq_core.p.a import f\n")
    (pkg / "a.py").write_text("from gnq_core.p.d import f\n")
    files = source_files(tmp_path)
    assert cycles_inside_packages(module_graph(files)[0]) == []
    assert cycles_inside_packages(module_graph(files, module_level=False)[0]) == [
        frozenset({"gnq_core.p.a", "gnq_core.p.d"})]


def gnq_imports(roots: tuple[str, ...] = ("gnq_core", "app", "research", "benchmarks", "examples")
                ) -> list[tuple[Path, int, str, list[str]]]:
    """(file, line, module, names) for every import of a gnq_core module, inside functions too."""
    return [(p, line, module, names) for top in roots for p in sorted((ROOT / top).rglob("*.py"))
            for module, names, line in imports(p) if module.split(".")[0] == "gnq_core"]


def unresolved(module: str, names: list[str]) -> list[str]:
    """What of ``from module import names`` (or ``import module``) does not exist."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError:
        return [module]
    return [f"{module}.{n}" for n in names if not hasattr(mod, n)
            and not (hasattr(mod, "__path__") and importlib.util.find_spec(f"{module}.{n}"))]


def test_every_import_of_gnq_core_resolves():
    """An import inside a function runs only when its path does (a full-scale study, a rare
    format): a module moved by a refactor must not leave one pointing at its old place."""
    missing = [f"{p.relative_to(ROOT)}:{line}: {', '.join(bad)}"
               for p, line, module, names in gnq_imports() if (bad := unresolved(module, names))]
    assert not missing, "imports that name nothing:\n" + "\n".join(missing)
    assert unresolved("gnq_core.sources.checkpoint_io", ["load_checkpoint"]) == [
        "gnq_core.sources.checkpoint_io"]
    assert unresolved("gnq_core.errors", ["one_line", "no_such_name"]) == ["gnq_core.errors.no_such_name"]


# ---------------------------------------------------------------- the engine's wings
# From the bottom up: what a wing may import is the wings below it (and itself).  The auditor and
# the self-check sit on top, in the engine's own folder.
WINGS = ("math", "sketch", "kernels", "plan", "passes")
MAX_FLAT_MODULES = 8  # modules at the top of gnq_core (a maintainer finds the rest by package)


def wing_of(module: str) -> int:
    """A module's floor in the engine: its wing's place in WINGS, or len(WINGS) for the top."""
    parts = module.split(".")
    return WINGS.index(parts[2]) if len(parts) > 2 and parts[2] in WINGS else len(WINGS)


def engine_edges() -> dict[str, set[str]]:
    """module -> the engine modules it imports: every import, inside functions and under ``if
    TYPE_CHECKING:`` too (an annotation that runs back up is a loop a reader must untangle)."""
    files = {m: p for m, p in source_files().items() if m.startswith("gnq_core.engine")}
    edges = {}
    for module, path in files.items():
        found = set()
        for target, names, _ in imports(path):
            found |= {f"{target}.{n}" for n in names if f"{target}.{n}" in files}
            submodules = any(f"{target}.{n}" in files for n in names)
            if target in files and not target.endswith("engine") and not submodules:
                found.add(target)
        edges[module] = found - {module}
    return edges


def test_the_engine_is_in_wings_and_no_wing_imports_one_above_it():
    engine = ROOT / "gnq_core" / "engine"
    flat = sorted(p.name for p in engine.glob("*.py"))
    assert flat == ["__init__.py", "auditor.py", "selfcheck.py"], flat
    assert sorted(p.name for p in engine.iterdir() if (p / "__init__.py").exists()) == sorted(WINGS)
    bad = [f"{m} imports {t}" for m, targets in engine_edges().items() for t in sorted(targets)
           if wing_of(t) > wing_of(m) and not m.endswith(".engine")]
    assert not bad, "\n".join(bad)


def test_no_import_loop_in_the_engine_even_through_annotations():
    edges = engine_edges()
    edges = {m: {t for t in ts if not t.endswith(".engine")} for m, ts in edges.items()}
    found = cycles_inside_packages(edges)
    assert not found, "import loops: " + "; ".join(" <-> ".join(sorted(c)) for c in found)


def test_at_most_eight_modules_flat_at_the_top_of_gnq_core():
    flat = sorted(p.name for p in (ROOT / "gnq_core").glob("*.py"))
    assert len(flat) <= MAX_FLAT_MODULES, flat


def test_every_moved_module_is_importable_by_its_old_path_with_a_warning_naming_the_new():
    import subprocess
    import sys

    from gnq_core import _moved

    for old, new in _moved.MOVED.items():
        assert importlib.util.find_spec(new), f"{old} moved to {new}, which does not exist"
        assert not (ROOT / (old.replace(".", "/") + ".py")).exists(), f"{old} is still there"
    program = ("import warnings, importlib, sys\n"
               "warnings.simplefilter('error')\n"
               "from gnq_core import _moved\n"
               "for old, new in _moved.MOVED.items():\n"
               "    try:\n        importlib.import_module(old)\n"
               "    except DeprecationWarning as w:\n        assert new in str(w), w\n"
               "    else:\n        raise SystemExit(f'no warning for {old}')\n"
               "    sys.modules.pop(old, None)\n"
               "warnings.simplefilter('ignore')\n"
               "for old, new in _moved.MOVED.items():\n"
               "    assert importlib.import_module(old) is importlib.import_module(new), old\n")
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
