"""Ctrl-C while `gnq` starts (Python importing typer, rich, torch: the first ~0.1-4 s) is one line and
exit code 130, never a KeyboardInterrupt traceback, through the real entry points:
the console script pyproject declares, ``python -m gnq_core.cli`` and the dashboard's job process.

Delays count from the moment a bare interpreter is up (measured here, so a loaded machine shifts
them too): Python's own start-up (its ``site`` module) comes before any code of ours can run."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

import gnq_core

REPO = Path(gnq_core.__file__).resolve().parents[1]


def _console_script() -> list[str]:
    """What pip's generated `gnq` script runs: the entry point pyproject.toml declares."""
    target = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["gnq"]
    module, func = target.split("#")[0].strip().split(":")
    return [sys.executable, "-c", f"import sys; from {module} import {func}; sys.exit({func}())"]


def _interpreter_up() -> float:
    """Seconds a bare interpreter (with this environment's site packages) takes to start and exit."""
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.perf_counter() - t0)
    return max(times)


def _interrupted(cmd: list[str], delay: float) -> tuple[int, str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["console script", "python -m"])
def test_ctrl_c_during_start_up_is_one_line(entry):
    cmd = _console_script() if entry == "console script" else [sys.executable, "-m", "gnq_core.cli"]
    up = _interpreter_up()
    for delay in (0.05, 0.2, 0.5, 1.0):  # imports of typer/rich, of torch, then the command itself
        rc, err = _interrupted([*cmd, "selfcheck", "--seed", "1"], up + delay)
        assert "Traceback" not in err, (delay, err[-2000:])
        assert len(err.strip().splitlines()) == 1 and err.startswith("interrupted"), (delay, err)
        assert rc == 130, (delay, rc, err)


@pytest.mark.slow
def test_ctrl_c_while_a_dashboard_job_starts(tmp_path):
    """The job process (`python -m gnq_core.jobs.jobs JOBFILE`) imports the pipelines first."""
    rc, err = _interrupted([sys.executable, "-m", "gnq_core.jobs.jobs", str(tmp_path / "job.json")],
                           _interpreter_up() + 0.05)
    assert "Traceback" not in err, err[-2000:]
    assert err.strip() == "interrupted" and rc == 130, (rc, err)
