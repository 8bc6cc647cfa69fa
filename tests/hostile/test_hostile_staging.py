"""New audit's "Clean up abandoned uploads" deletes only abandoned folders: another session's
staged uploads, waiting for its Start audit, are kept."""

from __future__ import annotations

import os
import time

from hostile_helpers import ROOT
from streamlit.testing.v1 import AppTest

from gnq_core.results import uploads_root


def _page(staging: str) -> AppTest:
    at = AppTest.from_file(str(ROOT / "gnq_core" / "dashboard" / "views" / "new_audit.py"),
                           default_timeout=60)
    at.session_state["staging"] = staging
    return at.run()


def test_clean_up_keeps_another_sessions_staged_uploads(tmp_path, monkeypatch):
    db = tmp_path / "gnq.duckdb"
    monkeypatch.setenv("GNQ_DB", str(db))
    other = _page("job-other")  # a session that uploaded its dataset and has not started yet
    staged = uploads_root(db) / "job-other"
    (staged / "data").mkdir(parents=True)
    (staged / "data" / "texts.txt").write_text("a staged upload\n", encoding="utf-8")
    abandoned = uploads_root(db) / "job-gone"  # a session that went away two days ago
    (abandoned / "data").mkdir(parents=True)
    two_days_ago = time.time() - 2 * 86400
    for path in (abandoned / "data", abandoned):
        os.utime(path, (two_days_ago, two_days_ago))
    for path in (staged / "data" / "texts.txt", staged / "data", staged):  # its upload was an hour ago
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    other.run()  # the waiting session is still there: its page run marks its folder in use

    me = _page("job-me")
    assert "1 upload folder(s)" in "\n".join(c.value for c in me.caption)
    me.button[-1].click().run()
    assert not me.exception
    assert not abandoned.exists()
    assert (staged / "data" / "texts.txt").read_text(encoding="utf-8") == "a staged upload\n"
