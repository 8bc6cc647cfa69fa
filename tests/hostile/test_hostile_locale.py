"""The C locale (ASCII): every file the tool reads or writes names its encoding, and a message the
terminal cannot encode is escaped, so `gnq audit` on Greek texts works under LC_ALL=C with
Python's UTF-8 mode off."""

from __future__ import annotations

import ast
import os
import subprocess

import duckdb
from hostile_helpers import ROOT, gnq_cmd, make_series

TEXT_CALLS = ("open", "read_text", "write_text")


def _without_encoding(path) -> list[str]:
    """Calls that read or write text in the locale's encoding: open() / Path.open() / os.fdopen() /
    temporary files in a text mode, read_text / write_text, subprocess.run / Popen / check_output
    with text=True, without encoding=."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
        keywords = {k.arg: k.value for k in node.keywords}
        if "encoding" in keywords or None in keywords:  # named, or passed on as **kwargs
            continue
        owner = ast.unparse(fn.value) if isinstance(fn, ast.Attribute) else ""
        if name in ("run", "Popen", "check_output") and owner == "subprocess":
            text = any(k in keywords for k in ("text", "universal_newlines"))
        elif (name == "open" and owner != "os") or name == "fdopen":  # os.open: a descriptor, no encoding
            position = 0 if name == "open" and owner not in ("", "io", "codecs") else 1  # path.open(mode)
            mode = node.args[position] if len(node.args) > position else keywords.get("mode")
            text = not (isinstance(mode, ast.Constant) and "b" in str(mode.value))
        elif name in ("TemporaryFile", "NamedTemporaryFile", "SpooledTemporaryFile"):  # binary unless told
            mode = node.args[0] if node.args else keywords.get("mode")
            text = isinstance(mode, ast.Constant) and "b" not in str(mode.value)
        else:
            text = name in ("read_text", "write_text")
        if text:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_every_text_read_and_write_names_its_encoding():
    files = [p for folder in ("gnq_core", "app", "tools") for p in sorted((ROOT / folder).rglob("*.py"))]
    assert len(files) > 100
    missing = [line for path in files for line in _without_encoding(path)]
    assert not missing, "\n".join(missing)


def test_an_audit_of_greek_texts_in_the_c_locale(tmp_path):
    series = make_series(tmp_path / "series", 1, max_length=16)
    texts = [f"Ο κωδικός PIN είναι {4821 + i} — λόγος {i} ≥ café" for i in range(6)]
    data = tmp_path / "texts.txt"
    data.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    db = tmp_path / "gnq.duckdb"  # a new store: its schema (with "λ" in a comment) is read first
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "PYTHONIOENCODING"))}
    env |= {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    proc = subprocess.run(gnq_cmd("audit", "--checkpoints", series, "--data", data, "--db", db, "--name", "r",
                                  "--batch-size", 3, "--max-length", 16),
                          capture_output=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode("utf-8", "replace")
    assert b"examples \\xd7 1 checkpoints" in proc.stdout  # "×", escaped for the ASCII terminal
    con = duckdb.connect(str(db), read_only=True)
    try:
        stored = [r[0] for r in con.execute("SELECT text FROM examples ORDER BY example_id").fetchall()]
    finally:
        con.close()
    assert stored == texts
