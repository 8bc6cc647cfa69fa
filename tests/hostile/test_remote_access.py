"""Remote use of the dashboard: a token when served beyond localhost, local paths
only under the data roots (GNQ_DATA_ROOTS), no folders created outside them."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile_helpers import ROOT, app_page
from streamlit.testing.v1 import AppTest

from gnq_core.access import OutsideRootsError, dashboard_command, local_path, token_ok, under_roots


@pytest.fixture
def roots(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    monkeypatch.setenv("GNQ_DATA_ROOTS", str(root))
    monkeypatch.setenv("GNQ_DB", str(root / "data" / "gnq.duckdb"))
    return root


def test_paths_outside_the_roots_are_refused(roots, tmp_path):
    assert under_roots(roots / "data" / "x.csv") == (roots / "data" / "x.csv").resolve()
    with pytest.raises(OutsideRootsError, match="outside the folders"):
        under_roots("/etc/passwd")
    with pytest.raises(OutsideRootsError):
        under_roots(roots / ".." / "elsewhere.csv")
    (roots / "link.txt").symlink_to("/etc/passwd")  # a symlink inside that points out
    with pytest.raises(OutsideRootsError):
        local_path(roots / "link.txt")


def test_roots_apply_only_when_configured_or_served_with_a_token(monkeypatch, tmp_path):
    monkeypatch.delenv("GNQ_DATA_ROOTS", raising=False)
    monkeypatch.delenv("GNQ_DASHBOARD_TOKEN", raising=False)
    assert local_path("/etc/passwd") == Path("/etc/passwd")  # local single user: as the CLI
    monkeypatch.setenv("GNQ_DASHBOARD_TOKEN", "t")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutsideRootsError):  # default roots: the working folder
        local_path("/etc/passwd")


def test_dashboard_command_makes_a_token_beyond_localhost():
    argv, env, token = dashboard_command(ROOT / "app" / "main.py", "0.0.0.0", 8600)
    assert token and env["GNQ_DASHBOARD_TOKEN"] == token
    assert argv[argv.index("--server.address") + 1] == "0.0.0.0"
    assert argv[argv.index("--browser.gatherUsageStats") + 1] == "false"
    argv, env, token = dashboard_command(ROOT / "app" / "main.py", "127.0.0.1", 8600)
    assert token is None and "GNQ_DASHBOARD_TOKEN" not in env


def test_token_check(monkeypatch):
    monkeypatch.delenv("GNQ_DASHBOARD_TOKEN", raising=False)
    assert token_ok(None)  # none required: local use
    monkeypatch.setenv("GNQ_DASHBOARD_TOKEN", "abc")
    assert token_ok("abc") and not token_ok("abd") and not token_ok(None) and not token_ok("")


def test_dashboard_asks_for_the_token(monkeypatch, roots):
    monkeypatch.setenv("GNQ_DASHBOARD_TOKEN", "s3cret")
    monkeypatch.setenv("GNQ_HTTP_GATE", "1")  # as app/server.py's gate sets it
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120).run()
    assert any("access token" in e.value for e in at.error)
    assert not at.title  # no page rendered
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
    at.query_params["token"] = "wrong"
    assert any("access token" in e.value for e in at.run().error)
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
    at.query_params["token"] = "s3cret"
    at.run()
    assert not at.exception and not any("access token" in e.value for e in at.error)


def test_store_field_and_path_fields_refuse_outside_the_roots(roots, tmp_path):
    outside = tmp_path / "newloc" / "sub" / "s.duckdb"
    at = app_page("runs", db_path=str(outside))
    assert any("outside the folders" in e.value for e in at.error)
    assert not (tmp_path / "newloc").exists()  # no folder created outside the roots
    at = app_page("new_audit", data_mode="Local path", data_path_input="/etc/passwd",
                  ckpt_path="/etc")
    errors = " ".join(e.value for e in at.error)
    assert errors.count("outside the folders") >= 1, errors
