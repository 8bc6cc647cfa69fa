"""`make app` on a fresh store: the dashboard answers (HTTP 200) within 60 s while the demo builds
in the background, with no traceback and no hint to start what make is starting.

Runs the app target's own commands (read from the Makefile, the venv's bin folder swapped for
this interpreter's) on a temporary store and port, then stops both processes it started.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gnq_core.jobs.jobs import cancel_job, list_jobs

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
LIMIT = 60.0


def _app_recipe() -> list[list[str]]:
    text = (ROOT / "Makefile").read_text()
    block = re.search(r"^app:.*\n((?:\t.*\n)+)", text, re.M)
    assert block, "the Makefile has an app target"
    bin_dir = str(Path(sys.executable).parent)
    return [shlex.split(line.strip().replace("$(VENV)/bin", bin_dir)) for line in block.group(1).splitlines()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_make_app_answers_within_a_minute_while_the_demo_builds(tmp_path):
    demo, dashboard = _app_recipe()
    assert demo[-2:] == ["demo", "--background"] and "streamlit" in dashboard[0]
    port = _free_port()
    env = os.environ | {"GNQ_DB": str(tmp_path / "gnq.duckdb"), "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    said = subprocess.run(demo, cwd=ROOT, env=env, capture_output=True, text=True, timeout=LIMIT)
    assert said.returncode == 0, said.stderr
    assert "in the background" in said.stdout and "streamlit run" not in said.stdout
    log = (tmp_path / "streamlit.log").open("w")
    server = subprocess.Popen([*dashboard, "--server.port", str(port), "--browser.gatherUsageStats", "false"],
                              cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    status = None
    try:
        while time.monotonic() - start < LIMIT and status != 200:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as reply:
                    status = reply.status
            except OSError:
                time.sleep(0.5)
        waited = time.monotonic() - start
        assert status == 200, f"no answer within {LIMIT:.0f} s"
        jobs = list_jobs(tmp_path / "gnq.duckdb")
        assert [j.run for j in jobs] == ["demo"] and jobs[0].alive(), "the demo builds in the background"
        print(f"dashboard answered after {waited:.1f} s")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=20)
        for job in list_jobs(tmp_path / "gnq.duckdb"):
            cancel_job(job)
        log.close()
    out = (tmp_path / "streamlit.log").read_text()
    assert "Traceback" not in out, out
