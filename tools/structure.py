"""The structure's facts, measured from the code's own imports: `python -m tools.structure [ROOT]`.

For the engine: its modules, the floors of its import graph (the longest chain of imports, a loop
counted as one floor), its import loops (every import counted, inside functions and under ``if
TYPE_CHECKING:`` too: a reader must untangle an annotation loop as well) and the files flat in its
folder; for gnq_core: the modules flat at its top and its lines; for the estimate: its module's
lines and its longest function.  docs/DESIGN.md quotes these numbers before and after a
restructure; ROOT is a checkout (default: this one), so an older commit can be measured from a
worktree of it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def _module(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the modules of ``package`` it imports (any import anywhere in the file)."""
    files = {_module(p, root): p for p in (root / package.replace(".", "/")).rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for module, path in files.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in files}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = {f"{node.module}.{a.name}" for a in node.names} & files.keys()
                found |= subs or ({node.module} & files.keys())
        edges[module] = found - {module, package}
    return edges


def loops(edges: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while v not in component:
                component.add(stack.pop())
            if len(component) > 1:
                found.append(component)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def floors(edges: dict[str, set[str]]) -> int:
    """The longest chain of imports, each loop taken as one module."""
    of = {m: frozenset(c) for c in loops(edges) for m in c}
    node = {m: of.get(m, frozenset({m})) for m in edges}
    down: dict[frozenset, set[frozenset]] = {}
    for m, targets in edges.items():
        down.setdefault(node[m], set()).update(node[t] for t in targets if node[t] != node[m])
    depth: dict[frozenset, int] = {}

    def height(n: frozenset) -> int:
        if n not in depth:
            depth[n] = 1 + max((height(t) for t in down.get(n, ())), default=0)
        return depth[n]

    return max((height(n) for n in set(node.values())), default=0)


def rooms(edges: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The graph of a package's rooms: each subpackage one room, each module flat in it one."""
    def room(m: str) -> str:
        return m.removeprefix(package + ".").split(".")[0]

    graph: dict[str, set[str]] = {}
    for m, targets in edges.items():
        if m != package:
            mine = graph.setdefault(room(m), set())
            mine.update(room(t) for t in targets - {package} if room(t) != room(m))
    return graph


def longest_function(path: Path) -> tuple[str, int]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    spans = [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
             if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    return max(spans, key=lambda s: s[1], default=("-", 0))


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def facts(root: Path) -> dict[str, object]:
    engine = import_graph(root, "gnq_core.engine")
    estimate = root / "gnq_core" / "pipelines" / "estimate_probe.py"
    name, length = longest_function(estimate)
    return {
        "engine modules": len(engine),
        "engine floors (modules)": floors(engine),
        "engine rooms (wings, flat modules)": len(rooms(engine, "gnq_core.engine")),
        "engine floors (rooms)": floors(rooms(engine, "gnq_core.engine")),
        "engine import loops": len(loops(engine)),
        "engine files flat in its folder": len(list((root / "gnq_core" / "engine").glob("*.py"))),
        "modules flat at the top of gnq_core": len(list((root / "gnq_core").glob("*.py"))),
        "lines in gnq_core": sum(_lines(p) for p in (root / "gnq_core").rglob("*.py")),
        "estimate_probe.py lines": _lines(estimate),
        "its longest function": f"{name}, {length} lines",
    }


def main(argv: list[str]) -> None:
    root = Path(argv[0] if argv else Path(__file__).resolve().parents[1]).resolve()
    for key, value in facts(root).items():
        print(f"{key:38s} {value}")


if __name__ == "__main__":
    main(sys.argv[1:])
