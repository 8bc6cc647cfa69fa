"""The upgrade path: today's newest releases in a scratch environment, checked against the lock.

``make upgrade-check`` (or ``python -m tools.upgrade_check``) does, without touching the project's
own ``.venv`` or ``requirements/lock.txt``:

1. resolves pyproject.toml's ranges to the newest releases with uv (``requirements/hold.txt`` left
   out: the holds are what this check is for; torch left out as in the lock);
2. compares that set with the lock: versions moved, packages added or dropped, major bumps;
3. installs it into a scratch virtual environment (the installed torch reused);
4. lists the model families the newest transformers registers that the family matrix does not,
   or no longer does, and checks each new one on the engine (exact / refused / not buildable tiny);
5. runs the test suite there (``--tests`` picks the pytest arguments);

and writes what it found to ``requirements/upgrade-report.md`` and ``.json``.  It exits 1 when the
suite failed or crashed (any pytest exit but 0: one that could not start is a failure, not "no
test failed") or the family probe crashed. Moving the lock
forward is then one commit: the hold lifted, ``make lock``, the family lists and the family table of
docs/api.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "lock.txt"
NO_TORCH = ROOT / "requirements" / "no-torch.txt"
HOLD = ROOT / "requirements" / "hold.txt"
EXTRAS = ("dashboard", "dev", "real")  # what `make install` and `make smollm2` install
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gnq-audit"

# Run inside the scratch environment: the family matrix's lists against that transformers, and
# every new family on the engine (the matrix test's own build/check, so the verdicts match it).
_FAMILY_PROBE = r"""
import json, sys
sys.path.insert(0, "tests")
import transformers
from families import NotBuildable, build, check, families
from test_family_matrix import EXACT, EXPECTED
found = families()
listed = set(EXACT) | set(EXPECTED)
new = sorted(set(found) - listed)
out = {"transformers": transformers.__version__, "new": {}, "gone": sorted(listed - set(found)),
       "task_changed": sorted(f for f in EXACT if f in found and found[f] != EXACT[f])}
for family in new:
    try:
        cells = check(build(family, found[family]), family, found[family])
    except NotBuildable as exc:
        out["new"][family] = {"task": found[family], "verdict": "unbuildable", "why": str(exc)[:300]}
        continue
    except Exception as exc:  # a crash outside the auditor: reported, not fatal to the check
        out["new"][family] = {"task": found[family], "verdict": "error",
                              "why": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
        continue
    refusals = [c.refusal for c in cells if c.refusal]
    inexact = [f"{c.path}: {c.detail}" for c in cells if not c.refusal and not c.exact]
    if refusals:
        out["new"][family] = {"task": found[family], "verdict": "refused", "why": refusals[0][:300]}
    elif inexact:  # beyond the bound derived from the problem (gnq_core.engine.math.tolerance)
        out["new"][family] = {"task": found[family], "verdict": "inexact", "why": inexact[0][:300]}
    else:
        out["new"][family] = {"task": found[family], "verdict": "exact",
                              "error": max(c.error for c in cells)}
print("FAMILIES " + json.dumps(out))
"""


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("$", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT, text=True, **kw)


def _uv() -> Path:
    """uv in its own tool environment (the Makefile's `lock` target uses the same one)."""
    tool = CACHE / "uv-tool"
    uv = tool / "bin" / "uv"
    if not uv.exists():
        _run([sys.executable, "-m", "venv", str(tool)], check=True)
        _run([str(tool / "bin" / "pip"), "install", "-q", "uv>=0.5"], check=True)
    return uv


def resolve(out: Path, *, holds: bool) -> None:
    """pyproject.toml's ranges resolved by uv to the newest releases for this project's machines
    (CPython 3.11, x86_64 manylinux), torch left out; ``holds``: with requirements/hold.txt (the
    lock, `make lock`), else without (the upgrade check's newest set)."""
    _run([str(_uv()), "pip", "compile", "pyproject.toml", *sum((["--extra", e] for e in EXTRAS), []),
          "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28",
          *(["--constraint", str(HOLD.relative_to(ROOT))] if holds else []),
          "--override", str(NO_TORCH.relative_to(ROOT)), "--upgrade", "-q",
          "--custom-compile-command", "make lock", "-o", str(out)], check=True)


def parse_lock(text: str) -> dict[str, str]:
    """{normalised name: version} of a pip-style lock (``name==version`` lines)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if m:
            out[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
    return out


def compare(locked: dict[str, str], newest: dict[str, str]) -> dict[str, list]:
    """Moved, added and dropped packages between two resolved sets; a major bump is flagged."""
    def major(v: str) -> str:
        return v.split(".")[0]

    moved = [{"package": p, "lock": locked[p], "newest": newest[p],
              "major": major(locked[p]) != major(newest[p])}
             for p in sorted(set(locked) & set(newest)) if locked[p] != newest[p]]
    return {"moved": moved, "added": sorted(set(newest) - set(locked)),
            "dropped": sorted(set(locked) - set(newest))}


# pytest's exit codes (pytest.ExitCode): only 0 is a pass, only 1 a run that finished with failures;
# every other code is a suite that did not run to its end, a failure of the check, never a pass.
PYTEST_EXITS = {0: "all passed", 1: "tests failed", 2: "interrupted", 3: "internal error",
                4: "usage error (the suite could not start)", 5: "no tests collected"}


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def _pytest_summary(output: str, exit_code: int) -> dict:
    """The suite's verdict from its exit code (a crash is a failure) and its output (what failed)."""
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", output, flags=re.M)))
    tail = [ln for ln in output.splitlines() if re.search(r"\d+ (passed|failed)", ln)]
    out = {"failed": failed, "summary": tail[-1].strip("= ") if tail else "no summary line",
           "exit": exit_code, "passed": exit_code == 0, "crashed": exit_code not in (0, 1)}
    if out["crashed"]:
        out["why"] = (f"pytest exit {exit_code} ({PYTEST_EXITS.get(exit_code, 'killed or crashed')}): "
                      f"{_last_line(output)}")
    return out


def _family_probe(returncode: int, stdout: str, stderr: str) -> dict:
    """The probe's findings, or a crash (no result line, or a non-zero exit) as an error."""
    line = next((ln for ln in stdout.splitlines() if ln.startswith("FAMILIES ")), None)
    if returncode != 0 or line is None:
        return {"error": f"the family probe crashed (exit {returncode}): {_last_line(stderr or stdout)}",
                "stderr": stderr[-2000:]}
    return json.loads(line[9:])


def failures(report: dict) -> list[str]:
    """Why the check did not pass: a crashed probe, a suite that crashed or had failures."""
    found = []
    if (report.get("families") or {}).get("error"):
        found.append(report["families"]["error"])
    tests = report.get("tests")
    if tests and not tests.get("passed", False):
        found.append(tests.get("why") or f"{len(tests['failed'])} test(s) failed: {tests['summary']}")
    return found


def render(report: dict) -> str:
    c, fam, tests = report["changes"], report.get("families") or {}, report.get("tests") or {}
    lines = [f"# Upgrade check: newest releases against requirements/lock.txt ({report['date']})", "",
             f"Machine: {report['machine']}. Scratch environment: `{report['venv']}`.", "",
             "## Versions that moved", "", "| package | lock | newest | major |", "|---|---|---|---|"]
    lines += [f"| {m['package']} | {m['lock']} | {m['newest']} | {'yes' if m['major'] else ''} |"
              for m in c["moved"]] or ["| (none) | | | |"]
    added, dropped = ", ".join(c["added"]) or "none", ", ".join(c["dropped"]) or "none"
    lines += ["", f"Added: {added}. Dropped: {dropped}.", ""]
    if fam.get("error"):
        lines += ["## Model families: not checked", "", f"**Failed**: {fam['error']}", ""]
    elif fam:
        lines += [f"## Model families in transformers {fam.get('transformers')}", "",
                  f"Gone from transformers: {', '.join(fam.get('gone', [])) or 'none'}. "
                  f"Task changed: {', '.join(fam.get('task_changed', [])) or 'none'}.", "",
                  "| new family | task | on the engine | detail |", "|---|---|---|---|"]
        for name, v in sorted(fam.get("new", {}).items()):
            detail = f"max relative error {v['error']:.1e}" if v["verdict"] == "exact" else v["why"]
            lines.append(f"| {name} | {v['task']} | {v['verdict']} | {detail.replace('|', '/')} |")
        if not fam.get("new"):
            lines.append("| (none) | | | |")
        lines.append("")
    if tests:
        lines += ["## Test suite on the newest releases", "", f"`pytest {tests['args']}`: {tests['summary']} "
                  f"({tests['seconds']:.0f} s).", ""]
        if tests.get("crashed"):
            lines.append(f"**The suite crashed, a failure**: {tests['why']}")
        elif tests.get("passed", not tests["failed"]):
            lines.append("No test failed.")
        lines += [f"- {t}" for t in tests["failed"]]
        if not tests["failed"] and not tests.get("passed", True) and not tests.get("crashed"):
            lines.append(f"pytest exit {tests['exit']} with no failure named: see its output")
        lines.append("")
    lines += ["To move the lock: lift the hold in requirements/hold.txt, `make lock`, list the new families "
              "in tests/engine/test_family_matrix.py, `cd tests && python -m families` (the table in "
              "docs/api.md), "
              "`make test`.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, default=CACHE / "upgrade-venv", help="scratch environment")
    ap.add_argument("--tests", default="-q -p no:cacheprovider",
                    help="pytest arguments for the suite in the scratch environment ('' skips it)")
    ap.add_argument("--no-families", action="store_true", help="skip the family probe")
    ap.add_argument("--out", type=Path, default=ROOT / "requirements" / "upgrade-report.md")
    ap.add_argument("--write-lock", action="store_true",
                    help="only re-resolve requirements/lock.txt with the holds (`make lock`)")
    args = ap.parse_args(argv)
    if args.write_lock:
        resolve(LOCK, holds=True)
        return 0

    args.venv.mkdir(parents=True, exist_ok=True)
    newest_lock = args.venv / "newest.txt"
    resolve(newest_lock, holds=False)
    changes = compare(parse_lock(LOCK.read_text(encoding="utf-8")),
                      parse_lock(newest_lock.read_text(encoding="utf-8")))

    py = args.venv / "bin" / "python"
    if not py.exists():
        _run([sys.executable, "-m", "venv", "--system-site-packages", str(args.venv)], check=True)
    if _run([str(py), "-c", "import torch"], capture_output=True).returncode:
        # torch lives in the project's .venv (the Makefile's CPU build): the same release, as the
        # Makefile installs it; never a resolution that could pick a CUDA wheel
        import torch

        _run([str(py), "-m", "pip", "install", "-q", f"torch=={torch.__version__.split('+')[0]}"], check=True)
    _run([str(py), "-m", "pip", "install", "-q", "-c", str(newest_lock), "-e", f".[{','.join(EXTRAS)}]"],
         check=True)
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "venv": str(args.venv),
                    "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
                    "changes": changes}
    if not args.no_families:
        probe = _run([str(py), "-c", _FAMILY_PROBE], capture_output=True,
                     env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})
        report["families"] = _family_probe(probe.returncode, probe.stdout, probe.stderr)
    if args.tests.strip():
        start = time.time()
        run = _run([str(py), "-m", "pytest", *args.tests.split()], capture_output=True,
                   env={**os.environ, "GNQ_REQUIRE_BROWSER": "1"})
        report["tests"] = {"args": args.tests, "seconds": time.time() - start,
                           **_pytest_summary(run.stdout + run.stderr, run.returncode)}
    args.out.write_text(render(report), encoding="utf-8")
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out} and {args.out.with_suffix('.json').name}")
    problems = failures(report)
    for problem in problems:
        print(f"upgrade check failed: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
