"""The documentation as a user meets it: a README read in two minutes, and a docs site that builds.

The site is built with ``mkdocs build --strict`` (a broken link, a missing page or a docstring the
API page cannot parse is an error), the CLI reference is what ``--help`` says today, and no page,
message or comment cites a tracker number where the reason itself should stand.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README_WORDS = 1_000


def test_readme_reads_in_two_minutes():
    words = len((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert words <= README_WORDS, f"README.md has {words} words (at most {README_WORDS})"


def test_readme_gives_the_two_commands_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "\nmake app " in readme and "\nmake test " in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_readme_links_resolve():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = [t for t in re.findall(r"\]\(([^)#]+)\)", readme) if "://" not in t]
    assert links, "README links to the docs"
    for target in links:
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_docs_site_builds_strict(tmp_path):
    # mkdocs, mkdocs-material and mkdocstrings come with the dev extra (as pytest does): a missing
    # one fails here rather than skipping the check that catches a broken link
    for tool in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers"):
        assert importlib.util.find_spec(tool) is not None, f"{tool} missing: pip install -e '.[dev]'"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    for page in ("index", "getting-started", "verdict", "evidence", "cli-reference", "api", "security"):
        assert (tmp_path / "site" / f"{page}.html").is_file(), page
    api = (tmp_path / "site" / "api.html").read_text(encoding="utf-8")
    assert "GNQAuditor" in api and "exact_gnq" in api  # rendered from the docstrings
    assert "Threat model" in (tmp_path / "site" / "security.html").read_text(encoding="utf-8")


def test_a_broken_link_fails_the_strict_build(tmp_path):
    """The strict build is not a formality: a page linking to a missing one stops it."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[gone](missing.md)\n", encoding="utf-8")
    (tmp_path / "mkdocs.yml").write_text("site_name: t\nstrict: true\nnav:\n  - Home: index.md\n",
                                         encoding="utf-8")
    # not -q: a quiet build does not count its warnings, so --strict would pass
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode != 0 and "missing.md" in out.stdout + out.stderr


def test_cli_reference_is_current():
    from tools import cli_reference

    page = (ROOT / "docs" / "cli-reference.md").read_text(encoding="utf-8")
    assert page == cli_reference.render(), "docs/cli-reference.md is stale: python -m tools.cli_reference"
    assert "## `gnq audit`" in page and "## `python -m research study companions`" in page


# A tracker number says nothing to a reader of the code or the docs; the reason itself should stand.
# CHANGELOG.md keeps its dated history; tests/ describe behaviour but are not shipped.
NO_TRACKER_NUMBERS = ("gnq_core", "app", "tools", "docs", "README.md", "SECURITY.md")
TEXT = {".py", ".md", ".sql", ".toml", ".yml", ".txt", ".html", ".js", ".css"}
TRACKER_NUMBER = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def test_no_issue_numbers_in_code_docs_or_messages():
    found = []
    for name in NO_TRACKER_NUMBERS:
        path = ROOT / name
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in TEXT)
        for f in files:
            for n, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if TRACKER_NUMBER.search(line):
                    found.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not found, "cite the reason, not the issue number:\n" + "\n".join(found)
