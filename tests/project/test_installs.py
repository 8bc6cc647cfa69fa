"""The three installs (pyproject.toml): the library alone, ``[dashboard]``, ``[dev]``.

``pip install gnq-audit`` must run GNQ in a training loop without the dashboard's packages, and
its dependency list must be what the library imports: a package it imports but does not declare
fails on a user's machine; one it declares but never imports is weight for nothing.

**The fresh install, offline** (``test_the_bare_library_installs_alone_and_runs``).  A venv made
with ``--system-site-packages`` would see streamlit and prove nothing, and there is no network
to download the base dependencies into a clean one.  So:

1. the project is built into a wheel (pip, no index, no build isolation) from a copy of its
   sources, and the wheel's own METADATA gives the base ``Requires-Dist`` (those without an
   ``extra ==`` marker): the list as a user's pip reads it;
2. the base dependencies' closure is computed with ``importlib.metadata`` from this
   environment's installed distributions (each one's requirements without an extra, markers
   evaluated);
3. a folder holds symlinks to exactly those distributions' top-level files (their packages,
   modules, ``.libs`` and ``.dist-info`` folders), and a ``.pth`` file in a fresh venv (no
   system site-packages) puts that folder on its path: the venv sees the closure and nothing else;
4. the wheel is installed there with ``pip --python VENV install --no-deps --no-index``.

Then, in the venv, from a folder outside the repository: streamlit and duckdb are not even
importable, ``import gnq_core`` imports neither, ``examples/plain_loop.py`` runs, the Trainer
integration imports, and ``gnq`` says in one line which extra to install.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata as md
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DASHBOARD_ONLY = ("streamlit", "duckdb", "plotly")

# Imported by library modules, but only in functions the library's own users never reach; each
# belongs to an extra, and the library runs without it.
OPTIONAL_IMPORTS = {
    "duckdb": "the store (results/store_schema's functions): [dashboard]",
    "scipy": "the post-hoc audit's companion solves (engine/sketch/companions.py): [dashboard]",
    "numba": "the faster CPU Gram (engine/math/cpu_gram.py falls back to the matmul): [dashboard]",
}
# Declared, though the library never imports them itself: what it runs needs them.
INDIRECT = {
    "pyarrow": "pandas writes the Trainer's Parquet shards with it",
    "accelerate": "transformers' Trainer refuses to run without it",
    "tokenizers": "transformers' fast tokenizers (a floor the project tests)",
    "safetensors": "transformers' checkpoint format (a floor the project tests)",
}


def base_requirements(metadata: str | None = None) -> list[Requirement]:
    """The base requirements: the wheel's METADATA ``Requires-Dist`` without an extra, or
    pyproject.toml's ``dependencies``."""
    if metadata is None:
        return [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    reqs = [Requirement(line.split(":", 1)[1].strip()) for line in metadata.splitlines()
            if line.startswith("Requires-Dist:")]
    return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def library_imports() -> dict[str, set[str]]:
    """{distribution: library modules importing it} for every third-party import (module level or
    in a function) of the gnq_core modules the library loads: the package, every engine module,
    the integrations' Trainer."""
    probe = r"""
import importlib, json, pkgutil, sys
import gnq_core, gnq_core.engine, gnq_core.integrations, gnq_core.integrations.hf
for m in pkgutil.walk_packages(gnq_core.engine.__path__, "gnq_core.engine."):
    importlib.import_module(m.name)
for name in gnq_core.__all__:
    getattr(gnq_core, name)
print(json.dumps({m: sys.modules[m].__file__ for m in sys.modules if m.split(".")[0] == "gnq_core"}))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env=os.environ | {"PYTHONPATH": str(ROOT)}, cwd=ROOT)
    owners = md.packages_distributions()
    found: dict[str, set[str]] = {}
    for module, path in json.loads(out.stdout.splitlines()[-1]).items():
        for node in ast.walk(ast.parse(Path(path).read_text(), path)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for top in {n.split(".")[0] for n in names} - {"gnq_core", "__future__"}:
                if top in sys.stdlib_module_names:
                    continue
                for dist in owners.get(top, [top]):
                    found.setdefault(canonicalize_name(dist), set()).add(module)
    return found


def test_the_base_dependencies_are_what_the_library_imports():
    declared = {canonicalize_name(r.name) for r in base_requirements()}
    imported = library_imports()
    undeclared = sorted(set(imported) - declared - set(OPTIONAL_IMPORTS))
    assert not undeclared, "imported by the library, not in pyproject's dependencies: " + "; ".join(
        f"{d} ({', '.join(sorted(imported[d]))})" for d in undeclared)
    unused = sorted(declared - set(imported) - set(INDIRECT))
    assert not unused, f"in pyproject's dependencies, never imported by the library: {unused}"
    assert not declared & set(OPTIONAL_IMPORTS), "an optional import is declared as a base dependency"
    stale = sorted(set(OPTIONAL_IMPORTS) - set(imported)) + sorted(set(INDIRECT) - declared)
    assert not stale, f"listed here but no longer imported / declared: {stale}"
    for d in DASHBOARD_ONLY:
        assert d not in declared


def test_the_extras_make_install_uses_are_the_ones_the_lock_resolves():
    """`make install` installs from the lock; the lock is resolved (tools/upgrade_check.py) with
    the extras `make install` and `make smollm2` ask for, and [dev] includes the dashboard."""
    from tools.upgrade_check import EXTRAS

    extras = PYPROJECT["project"]["optional-dependencies"]
    makefile = (ROOT / "Makefile").read_text()
    assert '-e ".[dashboard,dev]"' in makefile
    assert set(EXTRAS) <= set(extras) and {"dashboard", "dev"} <= set(EXTRAS)
    assert "gnq-audit[dashboard]" in extras["dev"]


# ---------------------------------------------------------------------- the fresh venv
def closure(requirements: list[Requirement]) -> list[md.Distribution]:
    """The installed distributions ``requirements`` need, their own requirements followed (no
    extras, markers evaluated for this interpreter)."""
    seen: dict[str, md.Distribution] = {}
    todo = list(requirements)
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            pytest.fail(f"{req.name} (a base dependency's closure) is not installed here")
        seen[name] = dist
        todo += [r for r in map(Requirement, dist.requires or [])
                 if r.marker is None or r.marker.evaluate({"extra": ""})]
    return list(seen.values())


def link_tops(dists: list[md.Distribution], folder: Path) -> None:
    """Symlinks in ``folder`` to every top-level file or folder of ``dists`` (scripts outside
    site-packages left out)."""
    folder.mkdir()
    for dist in dists:
        tops = {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            target = Path(dist.locate_file(top))
            if target.exists() and not (folder / top).exists():
                (folder / top).symlink_to(target)


def build_wheel(tmp: Path) -> Path:
    """The project's wheel, built offline from a copy of its sources (no build/ or egg-info
    left in the repository)."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for pattern in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]:
        top = pattern.rstrip("*").rstrip(".")
        if (ROOT / top).is_dir():
            shutil.copytree(ROOT / top, src / top, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", str(tmp / "wheel"), str(src)], check=True, cwd=tmp,
                   capture_output=True, text=True)
    (wheel,) = (tmp / "wheel").glob("gnq_audit-*.whl")
    return wheel


@pytest.mark.slow
def test_the_bare_library_installs_alone_and_runs(tmp_path):
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as z:
        metadata = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    base = base_requirements(metadata)
    declared = {canonicalize_name(r.name) for r in base_requirements()}
    assert {canonicalize_name(r.name) for r in base} == declared
    dists = closure(base)
    names = {canonicalize_name(d.metadata["Name"]) for d in dists}
    assert not names & set(DASHBOARD_ONLY), f"the base closure pulls in {names & set(DASHBOARD_ONLY)}"

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    link_tops(dists, tmp_path / "closure")
    (site / "gnq-base-closure.pth").write_text(f"{tmp_path / 'closure'}\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True, text=True)

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PATH": f"{venv / 'bin'}:{env.get('PATH', '')}"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(py), *args], capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=600)

    out = run("-c", "import importlib.util as u, gnq_core, sys; "
                    f"assert all(u.find_spec(m) is None for m in {DASHBOARD_ONLY!r}), 'visible'; "
                    "assert 'streamlit' not in sys.modules; print(gnq_core.__file__)")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith(str(site)), out.stdout  # the installed copy, not the repository's
    out = run("-c", "import sys, gnq_core.integrations.hf, gnq_core.engine; "
                    f"assert not {set(DASHBOARD_ONLY)!r} & set(sys.modules)")
    assert out.returncode == 0, out.stderr[-2000:]
    out = run(str(ROOT / "examples" / "plain_loop.py"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count(": GNQ [") == 6
    gnq = subprocess.run([str(venv / "bin" / "gnq"), "runs"], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=120)
    assert gnq.returncode == 1 and "Traceback" not in gnq.stderr
    (line,) = gnq.stderr.strip().splitlines()  # typer and rich may come with huggingface_hub; duckdb not
    assert line.startswith("gnq: the gnq command needs the dashboard extra (") and "duckdb" in line
    assert line.endswith("not installed): pip install 'gnq-audit[dashboard]'")


def test_importing_the_library_imports_no_dashboard_package():
    """The same promise in this environment, where the dashboard's packages are installed."""
    probe = ("import sys, importlib, pkgutil, gnq_core, gnq_core.engine, gnq_core.integrations, "
             "gnq_core.integrations.hf\n"
             "[importlib.import_module(m.name) for m in pkgutil.walk_packages(gnq_core.engine.__path__, "
             "'gnq_core.engine.')]\n"
             f"print(sorted({set(DASHBOARD_ONLY)!r} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env=os.environ | {"PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_the_gnq_command_names_the_extra_when_it_is_missing(monkeypatch):
    from gnq_core import launcher

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "duckdb" else real(name, *a))
    assert launcher.missing_extra() == ("gnq: the gnq command needs the dashboard extra (duckdb not "
                                        "installed): pip install 'gnq-audit[dashboard]'")
    monkeypatch.setattr(importlib.util, "find_spec", real)
    assert launcher.missing_extra() is None
