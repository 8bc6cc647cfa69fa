"""The upgrade path's comparison of a newest resolution with the lock (tools/upgrade_check.py),
and the lock itself: what `make install` reads must be a resolved set, torch left out."""

from pathlib import Path

from tools.upgrade_check import compare, parse_lock, render

ROOT = Path(__file__).resolve().parents[2]


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


def _report(**parts) -> dict:
    return {"date": "d", "machine": "m", "venv": "v", "changes": compare({}, {}), **parts}


def test_a_suite_that_crashes_at_start_up_is_a_failure_not_a_pass(tmp_path):
    """pytest exit 4 (it could not start: here an unknown option) names no failed test; the
    check reports the crash and fails, never "No test failed."."""
    import subprocess
    import sys

    from tools.upgrade_check import _pytest_summary, failures

    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n", encoding="utf-8")
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--no-such-option"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 4
    tests = {"args": "-q", "seconds": 1.0, **_pytest_summary(run.stdout + run.stderr, run.returncode)}
    assert tests["crashed"] and not tests["passed"] and tests["failed"] == []
    text = render(_report(tests=tests))
    assert "No test failed." not in text and "crashed" in text and "exit 4" in text
    assert failures(_report(tests=tests)) == [tests["why"]]
    ok = {"args": "-q", "seconds": 1.0, **_pytest_summary("1 passed in 0.01s", 0)}
    assert "No test failed." in render(_report(tests=ok)) and failures(_report(tests=ok)) == []
    failed = {"args": "-q", "seconds": 1.0, **_pytest_summary("FAILED t.py::x - boom\n1 failed", 1)}
    assert failures(_report(tests=failed)) and "No test failed." not in render(_report(tests=failed))


def test_a_crashed_family_probe_is_a_failure_not_transformers_none():
    import subprocess
    import sys

    from tools.upgrade_check import _family_probe, failures

    run = subprocess.run([sys.executable, "-c", "import no_such_module_for_the_probe"],
                         capture_output=True, text=True, timeout=60)
    fam = _family_probe(run.returncode, run.stdout, run.stderr)
    assert "crashed" in fam["error"] and "ModuleNotFoundError" in fam["error"]
    text = render(_report(families=fam))
    assert "transformers None" not in text and "not checked" in text and "ModuleNotFoundError" in text
    assert failures(_report(families=fam)) == [fam["error"]]
    # a probe that printed its line but then exited non-zero crashed too
    late = _family_probe(1, 'FAMILIES {"transformers": "5.0", "new": {}, "gone": []}\n', "Segmentation fault")
    assert "error" in late
