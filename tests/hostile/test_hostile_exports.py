"""Exports: every text reads back exactly from
CSV (a bare carriage return no longer splits a row), formula-leading cells in every column are
neutralised with a documented ``'`` (``--exact-csv`` opts out), and an export or a store onto a
FIFO, a device, a read-only folder, a path under a file or a full disk is one line, exit 1, with
nothing replaced and no temporary file left behind."""

from __future__ import annotations

import csv
import errno
import io
import json
import os
import resource
import signal
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from hostile_helpers import gnq, gnq_cmd, make_series
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.results.export import (
    EXPORT_COLUMNS,
    FORMULA_GUARD,
    FORMULA_STARTS,
    strip_formula_guard,
    to_bytes,
    write_table,
)
from gnq_core.results.store import Store
from gnq_core.results.store_schema import StoreError

TEXTS = ["plain text one", "line\rbreak then =1+1", "=HYPERLINK(\"http://x\",\"click\")", "+1 plus",
         "-2 minus", "@SUM(A1)", "\tTab first", "'quoted already", 'say "hi", then, go', "two\nlines",
         "\u202eRTL override", "zero\u200bwidth"]


def fails(*args: object) -> str:
    """`gnq ARGS` in this process: exit 1 with one `error:` line on stderr and no traceback."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 1, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.output, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("exports")
    series = make_series(root / "series", 1)
    data = root / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": t, "group": "=evil()" if i % 2 else "-g"}) + "\n"
                            for i, t in enumerate(TEXTS)))
    db = root / "gnq.duckdb"
    gnq("audit", "--checkpoints", series, "--data", data, "--name", "=evil()", "--db", db, "--quiet",
        "--max-length", 16, "--batch-size", 4)
    return db


# --------------------------------------------------------------------------------------------- 3: CSV


def test_every_text_reads_back_in_its_row_and_formulas_are_neutralised_in_every_column(db, tmp_path):
    out = tmp_path / "flagged.csv"
    gnq("export", "--run", "=evil()", "--format", "csv", "--out", out, "--db", db, "--quiet")
    frame = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert len(frame) == len(TEXTS)  # 13 rows with the bare \r unquoted
    assert sorted(strip_formula_guard(t) for t in frame["text"]) == sorted(TEXTS)
    assert set(frame["group"]) == {"'=evil()", "'-g"}
    for column in frame.columns:
        assert not frame[column].str.startswith(FORMULA_STARTS).any(), column
    exact = tmp_path / "exact.csv"
    gnq("export", "--run", "=evil()", "--format", "csv", "--out", exact, "--db", db, "--quiet", "--exact-csv")
    assert sorted(pd.read_csv(exact, dtype=str, keep_default_na=False)["text"]) == sorted(TEXTS)


def test_jsonl_and_parquet_are_unchanged(db, tmp_path):
    for fmt in ("jsonl", "parquet"):
        out = tmp_path / f"flagged.{fmt}"
        gnq("export", "--run", "=evil()", "--format", fmt, "--out", out, "--db", db, "--quiet")
        frame = pd.read_json(out, lines=True) if fmt == "jsonl" else pd.read_parquet(out)
        assert sorted(frame["text"]) == sorted(TEXTS) and set(frame["group"]) == {"=evil()", "-g"}


SPECIAL = st.sampled_from(["\r", "\n", "\r\n", '"', "'", ",", ";", "\t", "=", "+", "-", "@", "\x00", "\x0b",
                           "\x1b", "\u202e", "\u200f", "\u0627\u0644", "\u200b", "\ufeff", "\u2028", "\uff1d",
                           "\\", " "])
TEXT = st.lists(st.one_of(SPECIAL, st.text(st.characters(exclude_categories=("Cs",)), max_size=6)),
                min_size=1, max_size=8).map("".join)


def read_back(data: bytes) -> tuple[pd.DataFrame, list[list[str]]]:
    with_pandas = pd.read_csv(io.BytesIO(data), dtype=str, keep_default_na=False)
    with_csv = list(csv.reader(io.StringIO(data.decode(), newline="")))
    return with_pandas, with_csv


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(TEXT, min_size=1, max_size=6), groups=st.lists(TEXT, min_size=6, max_size=6))
def test_any_text_round_trips_through_csv_with_pandas_and_the_csv_module(texts, groups):
    frame = pd.DataFrame({c: range(len(texts)) for c in EXPORT_COLUMNS})
    frame["gnq_total"] = [-1.5 * i for i in range(len(texts))]  # negative numbers stay numbers
    frame["text"], frame["group"] = texts, groups[: len(texts)]
    for neutralise in (False, True):
        with_pandas, with_csv = read_back(to_bytes(frame, "csv", neutralise=neutralise))
        header, rows = with_csv[0], with_csv[1:]
        assert header == list(frame.columns) and len(rows) == len(with_pandas) == len(texts)
        undo = strip_formula_guard if neutralise else (lambda s: s)
        for column in ("text", "group"):
            assert [undo(v) for v in with_pandas[column]] == list(frame[column])
            assert [undo(r[header.index(column)]) for r in rows] == list(frame[column])
            if neutralise:
                assert not any(v.startswith(FORMULA_STARTS) for v in with_pandas[column])
        assert list(with_pandas["gnq_total"].astype(float)) == list(frame["gnq_total"])


def test_the_guard_is_documented_and_reversible():
    assert FORMULA_GUARD == "'" and {"=", "+", "-", "@", "\t", "\r"} <= set(FORMULA_STARTS)
    assert strip_formula_guard("'=1") == "=1" and strip_formula_guard("''x") == "'x"


# --------------------------------------------------------------------------------------------- 6: targets


def test_an_export_to_a_fifo_or_a_device_is_refused_and_the_fifo_stays(db, tmp_path):
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    for target in (fifo, Path("/dev/full")):
        line = fails("export", "--run", "=evil()", "--format", "csv", "--out", target, "--db", db)
        assert f"{target}: exists and is not a regular file" in line
    assert fifo.is_fifo() and Path("/dev/full").is_char_device()


def test_an_export_under_an_existing_file_is_one_line(db, tmp_path):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "sub" / "x.csv"
    line = fails("export", "--run", "=evil()", "--format", "csv", "--out", out, "--db", db)
    assert "x.csv" in line and ("Not a directory" in line or "File exists" in line)


def test_an_export_into_a_read_only_folder_is_one_line_and_leaves_nothing(db, tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
    else:  # root writes anywhere: make the write fail as a read-only file system does
        def read_only(*args, **kwargs):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        monkeypatch.setattr(pd.DataFrame, "to_csv", read_only)
    line = fails("export", "--run", "=evil()", "--format", "csv", "--out", folder / "x.csv", "--db", db)
    assert str(folder / "x.csv") in line and ("Read-only" in line or "Permission denied" in line)
    assert list(folder.iterdir()) == []


def test_an_export_onto_a_full_disk_is_one_line_and_the_temporary_file_is_removed(db, tmp_path):
    """A real write failure: the file-size limit (ulimit -f) stops the write half-way."""
    out = tmp_path / "full" / "x.csv"

    def small_disk() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write (EFBIG) instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))

    proc = subprocess.run(gnq_cmd("export", "--run", "=evil()", "--format", "csv", "--out", out, "--db", db),
                          capture_output=True, text=True, timeout=300, preexec_fn=small_disk)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: {out}: cannot write the export (File too large)"]
    assert list(out.parent.iterdir()) == []


def test_a_store_on_a_fifo_or_a_device_is_refused(tmp_path):
    fifo = tmp_path / "store.duckdb"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/full")):
        with pytest.raises(StoreError, match="not a store file"):
            Store(path).runs()
    assert fifo.is_fifo()


def test_write_table_refuses_what_it_must_not_replace(tmp_path):
    frame = pd.DataFrame({"text": ["a"]})
    with pytest.raises(ValueError, match="is a folder"):
        write_table(frame, tmp_path, "csv")
