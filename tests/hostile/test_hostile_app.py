"""The server: bound to localhost by the project's config; texts, groups, run and folder names
from users are shown as text, never rendered as HTML or Markdown, on every page."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib

import pytest
from hostile_helpers import ROOT, app_page, gnq, make_series, rendered
from streamlit.testing.v1 import AppTest

pytestmark = pytest.mark.slow

HOSTILE = ["<script>alert('x')</script>", "**bold** and _italic_", "<img src=x onerror=alert(1)>",
           "[click](javascript:alert(1))", ":red[colour] $x^2$ :material/warning:"]
# Each is markup only when not backslash-escaped (as Markdown reads it).
MARKERS = [re.compile(r"(?<!\\)" + m)
           for m in (r"<script", r"\*\*bold", r"<img", r"\]\(javascript", r":red\[", r"\$x", r":material/")]


def test_the_server_listens_on_localhost_only():
    config = tomllib.loads((ROOT / "app" / ".streamlit" / "config.toml").read_text())
    assert config["server"]["address"] == "localhost"
    assert config["browser"]["gatherUsageStats"] is False
    # Streamlit itself, started from the project folder (as `make app` does), reads it.
    code = "from streamlit import config; config._main_script_path = 'app/main.py'; " \
           "config.get_config_options(force_reparse=True); " \
           "print(config.get_option('server.address'))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "localhost", out.stderr


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    series = make_series(root / "series", 2)
    (series / "epoch-2").rename(series / "epoch-2 **x** <b>y :red[z]")  # a folder name is user data too
    data = root / "texts.jsonl"
    rows = [{"text": f"{h} number {i} with some more words to attack",
             "group": HOSTILE[(i + 1) % len(HOSTILE)]} for i, h in enumerate(HOSTILE * 3)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    db = root / "gnq.duckdb"
    name = "<b>run</b> **r** :red[x]"
    gnq("audit", "--checkpoints", series, "--data", data, "--db", db, "--name", name, "--batch-size", 5,
        "--max-length", 16, "--quiet")
    gnq("extract", "--run", name, "--db", db, "--prefix-tokens", 3, "--quiet")
    return db, name, rows


def markdown_of(at) -> list[str]:
    """Every element whose value Streamlit renders as Markdown."""
    kinds = ("markdown", "caption", "title", "header", "subheader", "info", "warning", "error", "success")
    values = [e.value for kind in kinds for e in at.get(kind)]
    return values + [p.text for p in at.get("progress")]


@pytest.mark.parametrize("name", ["runs", "trajectories", "extraction", "groups", "drilldown", "flagged",
                                  "new_audit"])
def test_user_data_is_never_rendered_as_markup(hostile_store, monkeypatch, name):
    db, run, rows = hostile_store
    monkeypatch.setenv("GNQ_DB", str(db))
    at = app_page(name, run_name=run, example_id=0)
    assert not at.exception, [e.message for e in at.exception]
    for value in markdown_of(at):
        for marker in MARKERS:
            assert not marker.search(value), (name, marker.pattern, value)
    shown = "\n".join(rendered(v) for v in markdown_of(at))
    if name == "runs":
        assert f"Run {run!r}" in shown  # escaped, so it reads exactly as named
    if name == "drilldown":
        assert at.code[0].value == rows[0]["text"]  # plain text, exactly as stored
        assert f"Group: {rows[0]['group']}" in shown
    if name == "groups":
        assert any(g in shown for g in HOSTILE)


@pytest.mark.parametrize("text", ["²", "٣", "-1", "9" * 40, "1e3"])
def test_an_odd_linked_text_is_ignored_not_a_traceback(hostile_store, monkeypatch, text):
    """`/drilldown?text=²` raised ValueError ("²".isdigit() is True, int("²") fails)."""
    db, run, _ = hostile_store
    monkeypatch.setenv("GNQ_DB", str(db))
    at = AppTest.from_file(str(ROOT / "gnq_core" / "dashboard" / "views" / "drilldown.py"),
                           default_timeout=120)
    at.session_state["run_name"] = run
    at.query_params["text"] = text
    at.run()
    assert not at.exception, [e.message for e in at.exception]
