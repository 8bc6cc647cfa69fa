"""The examples: the plain PyTorch loop runs (tiny model from config, no network) and both
examples reach GNQ only through the public doors, ``gnq_core`` and ``gnq_core.integrations``
(the Trainer example's run: tests/integrations/test_finetune_runs.py)."""

from __future__ import annotations

import ast
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PUBLIC = ("gnq_core", "gnq_core.integrations", "gnq_core.integrations.hf", "gnq_core.integrations.trl")


def gnq_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return [m for m in found if m.split(".")[0] == "gnq_core"]


@pytest.mark.parametrize("name", ["plain_loop.py", "finetune_with_gnq.py"])
def test_examples_import_only_the_public_doors(name):
    used = gnq_imports(EXAMPLES / name)
    assert used and all(m in PUBLIC for m in used), used


def test_the_plain_loop_is_short_and_runs():
    path = EXAMPLES / "plain_loop.py"
    assert len(path.read_text().splitlines()) <= 40
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "unexpected behavior" not in out.stderr
    lines = [line for line in out.stdout.splitlines() if ": GNQ [" in line]
    assert len(lines) == 6  # 3 epochs × 2 batches
    values = [float(v) for line in lines for v in line.split("[")[1].rstrip("]").split(",")]
    assert len(values) == 18 and all(math.isfinite(v) and v > 0 for v in values)
