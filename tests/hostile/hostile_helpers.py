"""Shared by the hostile suite: the `gnq` command in-process and as a real subprocess, killing a
subprocess at a chosen moment, and fingerprints of a store to prove it was left unchanged."""

from __future__ import annotations

import contextlib
import hashlib
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pandas as pd
import pytest
import torch
from lm_fixtures import texts
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

from gnq_core.cli import app

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "gnq_core" / "dashboard"
TABLES = ("runs", "examples", "points", "batches", "scores", "extractions", "example_metrics")


def gnq(*args: object) -> str:
    """`gnq ARGS` in this process; must succeed."""
    result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def gnq_fails(*args: object) -> str:
    """`gnq ARGS` in a subprocess (real stderr, real exit code); must fail with one line, no traceback."""
    proc = subprocess.run(gnq_cmd(*args), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def gnq_cmd(*args: object) -> list[str]:
    return [sys.executable, "-m", "gnq_core.cli", *(str(a) for a in args)]


@contextlib.contextmanager
def as_a_fresh_process() -> Iterator[None]:
    """Run in-process code under a new process's default dtype (tests default to float64), so its
    results are comparable bit for bit with those of a `gnq` subprocess."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def kill_when(proc: subprocess.Popen, ready: Callable[[], bool], what: str, timeout: float = 240,
              paused: bool = False, store: Path | None = None) -> None:
    """SIGKILL ``proc`` (no cleanup, like a laptop lid or the OOM killer) as soon as ``ready()``.

    ``paused``: ask ``ready()`` only while the process is stopped (SIGSTOP, then SIGCONT), so it
    cannot move on between the answer and the kill: for jobs that finish quickly once started.
    ``store``: the file ``ready()`` reads.  Its answer can change only when the job writes it, so
    it is asked only after the file (or its WAL) changed, after a look that could not read it
    (the job was writing), and at least every half second: the job then runs at full speed
    between its commits (a look costs a DuckDB open, and stopping the job for one every 10 ms
    made it run at a fifth of its speed) and is still stopped right after each of them.
    """
    deadline = time.monotonic() + timeout
    seen, looked, unread = None, -1.0, True
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the job ended (exit {proc.returncode}) before {what}; nothing to interrupt")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"timed out waiting for {what}")
        if store is not None:
            files = _file_state(store)
            if files == seen and not unread and time.monotonic() - looked < 0.5:
                time.sleep(0.002)
                continue
            seen = files
        if paused:
            proc.send_signal(signal.SIGSTOP)
        answer, unread = False, False
        try:
            answer = ready()
        except duckdb.Error:  # the job is writing the store: look again in a moment
            unread = True
        except Exception:  # noqa: S110 - no store or no run yet: not ready
            pass
        looked = time.monotonic()
        if answer:
            break
        if paused:
            proc.send_signal(signal.SIGCONT)
        time.sleep(0.002 if store is not None else 0.01 if paused else 0.03)
    proc.send_signal(signal.SIGKILL)
    if paused:
        proc.send_signal(signal.SIGCONT)  # a stopped process takes SIGKILL only once it runs
    proc.wait()


def _file_state(db: Path) -> tuple:
    """Size, change time and inode of the store and its WAL (None where absent): any commit changes it."""
    state = []
    for path in (db, db.with_name(db.name + ".wal")):
        try:
            st = path.stat()
        except FileNotFoundError:
            state.append(None)
        else:
            state.append((st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
    return tuple(state)


def run_row(db: Path, name: str) -> pd.Series | None:
    """The run's row (status, progress, points done) read straight from the file, or None."""
    if not db.exists():
        return None
    con = duckdb.connect(str(db), read_only=True)
    try:
        frame = con.execute("""SELECT r.*, (SELECT count(*) FROM points p WHERE p.run_id = r.run_id
                                             AND p.status = 'done') AS points_done,
                                    (SELECT count(*) FROM extractions e WHERE e.run_id = r.run_id)
                                             AS extraction_rows
                               FROM runs r WHERE name = ?""", [name]).df()
    finally:
        con.close()
    return None if frame.empty else frame.iloc[0]


def store_fingerprint(db: Path) -> tuple[str, dict[str, pd.DataFrame]]:
    """(sha256 of the file's bytes, every table's rows): equal before and after = unchanged."""
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    con = duckdb.connect(str(db), read_only=True)
    try:
        tables = {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").df() for t in TABLES}
    finally:
        con.close()
    return digest, tables


def assert_store_unchanged(db: Path, before: tuple[str, dict[str, pd.DataFrame]]) -> None:
    after = store_fingerprint(db)
    for table in TABLES:
        pd.testing.assert_frame_equal(after[1][table], before[1][table], obj=table)
    assert after[0] == before[0], "the store file's bytes changed"


def write_texts_csv(path: Path, n: int) -> Path:
    rows = list(texts(n))
    pd.DataFrame({"text": rows, "group": ["a" if i % 3 else "b" for i in range(n)]}).to_csv(path, index=False)
    return path


def make_series(folder: Path, n: int, max_length: int = 32) -> Path:
    """n checkpoints epoch-1..epoch-n of a tiny GPT-2 (different seeds) with a locally trained tokenizer."""
    from gnq_core.sources.checkpoints.save import save_checkpoint
    from gnq_core.sources.models import build_model, train_tokenizer

    tokenizer = train_tokenizer(texts(200), vocab_size=300)
    for k in range(1, n + 1):
        model = build_model("tiny", len(tokenizer), max_length, seed=k)
        save_checkpoint(model, tokenizer, folder / f"epoch-{k}")
    return folder


def app_page(name: str, **state) -> AppTest:
    """One dashboard page run headless (the store comes from $GNQ_DB)."""
    path = ROOT / "app" / "main.py" if name == "main" else DASHBOARD / "views" / f"{name}.py"
    at = AppTest.from_file(str(path), default_timeout=120)
    for key, value in state.items():
        at.session_state[key] = value
    return at.run()


def rendered(markdown: str) -> str:
    """What a reader sees of a Markdown string whose user data was backslash-escaped."""
    return re.sub(r"\\(.)", r"\1", markdown)
