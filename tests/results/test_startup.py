"""Start-up of what only reads the store: `gnq runs`, `gnq export`, `gnq report` and the dashboard's
reading pages import neither torch nor transformers (torch alone took 3 s of `gnq runs`' 6).  Each
runs in a fresh interpreter against a small store, which reports at exit what it had imported: an
import check, not a timer."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gnq_core.results.records import RunSpec, ScoreColumns, batch_results
from gnq_core.results.store import Store

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers")
N = 12
# Every page but "New audit" (which starts audits and lists the model presets) only reads the store.
READING_PAGES = ["runs", "trajectories", "extraction", "groups", "drilldown", "flagged", "dataset_map",
                 "compare", "regression"]


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    """A store with one audit run of N texts over two checkpoints, written through the Store API."""
    path = tmp_path_factory.mktemp("startup") / "gnq.duckdb"
    store = Store(path)
    examples = pd.DataFrame({"example_id": range(N),
                             "text": [f"text {i} " + "word " * (i % 5) for i in range(N)],
                             "grp": ["a" if i % 2 else "b" for i in range(N)],
                             "n_tokens": [3 + i % 5 for i in range(N)]})
    run = store.create_run(RunSpec(name="r", kind="audit", lam=0.01, batch_size=4, seed=0, max_length=16,
                                   model_path="m", dataset_path="d.csv", dataset_hash="h", n_examples=N,
                                   code_version="test", device="cpu", dtype="float64"), examples)
    rng = np.random.default_rng(0)
    for point in range(2):
        parts = [batch_results(list(range(e, e + 4)), list(rng.uniform(1, 3, 4)), list(rng.uniform(0, 2, 4)),
                               list(rng.uniform(0.1, 1, 4)), batch_index=e // 4, step=None, condition=3.0,
                               finite=True, seconds=0.1) for e in range(0, N, 4)]
        store.write_point(run.run_id, point, ScoreColumns.joined([p[0] for p in parts]),
                          [p[1] for p in parts], 0.2)
    return path


def imported_heavy(code: str) -> list[str]:
    """Runs ``code`` in a fresh interpreter (the worktree first on the path); the heavy modules it
    had imported when it ended, however it ended."""
    loaded = f"[m for m in {HEAVY!r} if m in sys.modules]"
    report = f"sys.stderr.write('\\nIMPORTED ' + json.dumps({loaded}) + '\\n')"
    wrapper = ("import json, sys\ntry:\n" + textwrap.indent(textwrap.dedent(code).strip("\n"), "    ")
               + "\nfinally:\n    " + report + "\n")
    done = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(ROOT)},
                          timeout=300, check=False)
    line = [x for x in done.stderr.splitlines() if x.startswith("IMPORTED ")]
    assert line, done.stderr[-2000:]
    return json.loads(line[-1].removeprefix("IMPORTED "))


def gnq(*args: object) -> str:
    """Code that runs `gnq ARGS` as the command line does and fails unless it exits with 0."""
    argv = ["gnq", *map(str, args)]
    return f"""
        import runpy
        sys.argv = {argv!r}
        try:
            runpy.run_module("gnq_core.cli", run_name="__main__")
        except SystemExit as exc:
            assert not exc.code, exc.code
        """


@pytest.mark.parametrize("command", [
    ("runs",), ("runs", "--json"),
    ("export", "--run", "r", "--out", "{tmp}/flagged.csv"),
    ("report", "--run", "r", "--json", "{tmp}/report.json", "--out", "{tmp}/report.html", "--resamples", 10),
], ids=lambda c: " ".join(map(str, c[:2])))
def test_reading_commands_import_neither_torch_nor_transformers(db, tmp_path, command):
    args = [str(a).format(tmp=tmp_path) for a in command]
    assert imported_heavy(gnq(*args, "--db", db)) == []
    if command[0] != "runs":  # they did their work
        assert all(Path(a).stat().st_size > 0 for a in args if a.startswith(str(tmp_path)))


def test_the_check_sees_torch_when_it_is_imported(db):
    """The check can fail: a command that does need torch (a selfcheck's import) is seen."""
    assert imported_heavy(textwrap.dedent(gnq("runs", "--db", db)) + "import torch\n") == ["torch"]


VIEWS = ROOT / "gnq_core" / "dashboard" / "views"


def test_the_dashboards_reading_pages_import_neither_torch_nor_transformers(db):
    code = f"""
        import os
        from streamlit.testing.v1 import AppTest
        os.environ["GNQ_DB"] = {str(db)!r}
        for name in {READING_PAGES!r}:
            at = AppTest.from_file(os.path.join({str(VIEWS)!r}, name + ".py"),
                                   default_timeout=120)
            at.run()
            assert not at.exception, (name, [e.message for e in at.exception])
        """
    assert imported_heavy(code) == []
