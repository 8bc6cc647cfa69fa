"""The upgrade path's comparison of a newest resolution with the lock (tools/upgrade_check.py),
and the lock itself: what `make install` reads must be a resolved set, torch left out."""

from pathlib import Path

from tools.upgrade_check import compare, parse_lock, render

ROOT = Path(__file__).resolve().parents[1]


def test_compare_reports_moved_added_dropped_and_major_bumps():
    locked = parse_lock("transformers==5.23.0\n    # via x\nduckdb==1.4.2\nFoo_Bar==1.0\n")
    newest = parse_lock("transformers==5.24.0\nduckdb==2.0.1\nnew-pkg==0.1 ; python_version >= '3.11'\n")
    c = compare(locked, newest)
    assert c["moved"] == [{"package": "duckdb", "lock": "1.4.2", "newest": "2.0.1", "major": True},
                          {"package": "transformers", "lock": "5.23.0", "newest": "5.24.0", "major": False}]
    assert c["added"] == ["new-pkg"] and c["dropped"] == ["foo-bar"]
    text = render({"date": "d", "machine": "m", "venv": "v", "changes": c,
                   "families": {"transformers": "5.24.0", "gone": [], "task_changed": [],
                                "new": {"dory": {"task": "causal", "verdict": "refused", "why": "a|b"}}},
                   "tests": {"args": "-q", "summary": "1 failed, 2 passed", "seconds": 3.0,
                             "failed": ["tests/x.py::t"]}})
    assert "| duckdb | 1.4.2 | 2.0.1 | yes |" in text and "| dory | causal | refused | a/b |" in text
    assert "- tests/x.py::t" in text


def test_the_lock_is_a_resolved_set_without_torch():
    lock = parse_lock((ROOT / "requirements" / "lock.txt").read_text())
    assert {"transformers", "duckdb", "pandas", "streamlit", "numba", "pytest"} <= set(lock)
    # torch (and the CUDA packages a PyPI torch wheel pulls in) stay out: an installed torch is reused
    assert not {p for p in lock if p == "torch" or p.startswith(("nvidia-", "triton"))}
    assert all(v[0].isdigit() for v in lock.values())
