"""The dashboard's server settings do not depend on the folder it is started from:
a real `streamlit run /abs/path/app/main.py` started in a temporary folder listens on localhost
only, with usage statistics off; so does `gnq dashboard`.  A dataset path that is a link out of
its folder (to /etc/passwd) is refused on the New audit page."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import psutil
import pytest
from hostile_helpers import ROOT, app_page, rendered

pytestmark = pytest.mark.slow

# The real `streamlit run`, reporting the server's own config just before it starts serving.
LAUNCH = """
import sys
from streamlit import config
from streamlit.web import bootstrap, cli
serve = bootstrap.run
def run(*args, **kwargs):
    print("SETTINGS", config.get_option("server.address"), config.get_option("browser.gatherUsageStats"),
          flush=True)
    return serve(*args, **kwargs)
bootstrap.run = run
sys.argv = ["streamlit", "run", *sys.argv[1:]]
cli.main()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(pid: int, port: int, timeout: float = 90) -> set[str]:
    """The addresses the process (or a child) listens on at ``port``, once it does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        found = {c.laddr.ip for p in procs for c in p.net_connections("inet")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
        if found:
            return found
        time.sleep(0.2)
    pytest.fail(f"nothing listened on port {port} within {timeout} s")


@pytest.mark.parametrize("how", ["streamlit run", "gnq dashboard"])
def test_started_from_another_folder_it_listens_on_localhost_with_statistics_off(tmp_path, how):
    port = free_port()
    env = {**os.environ, "HOME": str(tmp_path), "GNQ_DB": str(tmp_path / "gnq.duckdb"),
           "PYTHONPATH": str(ROOT)}
    env = {k: v for k, v in env.items() if not k.startswith("STREAMLIT_")}
    main_py = str(ROOT / "app" / "main.py")
    cmd = ([sys.executable, "-c", LAUNCH, main_py, "--server.port", str(port)] if how == "streamlit run"
           else [sys.executable, "-m", "gnq_core.cli", "dashboard", "--port", str(port)])
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        addresses = listening(proc.pid, port)
        assert addresses <= {"127.0.0.1", "::1"}, addresses
        if how == "streamlit run":
            assert proc.stdout.readline().split() == ["SETTINGS", "localhost", "False"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_dataset_path_linking_out_of_its_folder_is_refused(tmp_path, monkeypatch):
    link = tmp_path / "texts.txt"
    link.symlink_to("/etc/passwd")
    monkeypatch.setenv("GNQ_DB", str(tmp_path / "gnq.duckdb"))
    at = app_page("new_audit", data_mode="Local path", data_path_input=str(link))
    errors = [rendered(e.value) for e in at.error]
    assert any(f"{link}: a link to /etc/passwd, outside" in e for e in errors), errors
    assert not any(re.search(r"\d texts", rendered(c.value)) for c in at.caption)  # was "24 texts"

