"""Untrusted datasets: every loader, fed any bytes, gives a TextDataset or a one-line DatasetError
naming the file (hypothesis); huge lines are refused without being held in memory; millions of
rows are streamed; NaN/empty texts are dropped and counted; the CLI says so in one line."""

from __future__ import annotations

import json
import tempfile
import tracemalloc
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hostile_helpers import assert_store_unchanged, gnq, make_series, store_fingerprint
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.sources.datasets import MAX_TEXT_BYTES, SUFFIXES, DatasetError, TextDataset, load_texts

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MB = 1 << 20


def load_or_refuse(path: Path, **kwargs) -> TextDataset | DatasetError:
    """The loader's contract: a dataset, or a DatasetError whose one line names the file."""
    try:
        ds = load_texts(path, **kwargs)
    except DatasetError as e:
        message = str(e)
        assert message.startswith(str(path)) and "\n" not in message and "\r" not in message, message
        return e
    assert isinstance(ds, TextDataset) and len(ds) == len(ds.texts) == len(ds.groups) > 0
    assert all(isinstance(t, str) and t.strip() for t in ds.texts)
    assert all(g is None or isinstance(g, str) for g in ds.groups)
    return ds


# Bytes that look a little like each format, with the usual hostile ingredients mixed in.
FRAGMENTS = st.sampled_from([b"text", b"group", b",", b"\"", b"\"\"", b"\n", b"\r\n", b"\r", b"{", b"}",
                             b"[", b"]", b":", b"\"text\"", b"null", b"NaN", b"1e999", b"\xef\xbb\xbf",
                             b"\xff", b"\xc3", b"\xc3\xa9", b"\x00", b"\\", b"\\u0000", b"\\ud800", b" ",
                             b"PAR1", b"\t", "日本".encode(), b"<script>", b"\xf0\x9f\x9a\x80"])
LOOKALIKE = st.lists(FRAGMENTS | st.binary(max_size=8), max_size=40).map(b"".join)


@FUZZ
@given(suffix=st.sampled_from(SUFFIXES), data=st.binary(max_size=300) | LOOKALIKE)
def test_any_bytes_give_a_dataset_or_a_one_line_error(suffix: str, data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"fuzz{suffix}"
        path.write_bytes(data)
        load_or_refuse(path)
        if suffix != ".txt":
            load_or_refuse(path, text_column="group", group_column="text")


VALUES = st.none() | st.floats() | st.integers() | st.text() | st.booleans() | st.lists(st.integers())


@FUZZ
@given(rows=st.lists(st.dictionaries(st.sampled_from(["text", "group", "x"]), VALUES, max_size=3),
                     min_size=1, max_size=8),
       cut=st.integers(min_value=0, max_value=400), flip=st.integers(min_value=0, max_value=255))
def test_valid_files_corrupted_give_a_dataset_or_a_one_line_error(rows, cut, flip) -> None:
    """Well-formed jsonl/csv/parquet with odd values, then truncated or with one byte changed."""
    with tempfile.TemporaryDirectory() as d:
        frame = pd.DataFrame(rows).astype(object) if any(rows) else pd.DataFrame({"text": [None]})
        paths = [Path(d) / "v.jsonl", Path(d) / "v.csv", Path(d) / "v.parquet"]
        paths[0].write_text("".join(json.dumps(r) + "\n" for r in rows))
        frame.to_csv(paths[1], index=False)
        try:
            pq.write_table(pa.Table.from_pandas(frame.astype(str)), paths[2])
        except (pa.ArrowException, ValueError):
            paths.pop()
        for path in paths:
            load_or_refuse(path)
            data = bytearray(path.read_bytes())
            path.write_bytes(bytes(data[: cut % (len(data) + 1)]))
            load_or_refuse(path)
            if data:
                data[cut % len(data)] ^= flip
                path.write_bytes(bytes(data))
                load_or_refuse(path)


@pytest.mark.parametrize("suffix", [".txt", ".jsonl", ".csv"])
def test_a_50_mb_line_is_refused_in_one_line_without_holding_it(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"huge{suffix}"
    head = {".txt": b"a short text\n", ".jsonl": b'{"text": "short"}\n', ".csv": b"text\nshort\n"}[suffix]
    body = b"x" * (50 * MB)
    line = {".txt": body, ".jsonl": b'{"text": "' + body + b'"}', ".csv": b'"' + body + b'"'}[suffix]
    path.write_bytes(head + line + b"\n")
    tracemalloc.start()
    try:
        error = load_or_refuse(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(error, DatasetError)
    lineno = head.count(b"\n") + 1
    assert f"line {lineno} is longer than {MAX_TEXT_BYTES:,} bytes" in str(error)
    assert peak < 8 * MB, f"refusing the line took {peak / MB:.0f} MiB"


def test_a_50_mb_parquet_text_is_refused_and_a_smaller_limit_applies(tmp_path: Path) -> None:
    path = tmp_path / "huge.parquet"
    pq.write_table(pa.table({"text": ["short", "y" * (50 * MB)]}), path)
    error = load_or_refuse(path)
    assert isinstance(error, DatasetError) and "row 2: the text is 52,428,800 bytes" in str(error)
    small = tmp_path / "small.txt"
    small.write_text("12345\n1234567890\n")
    assert load_texts(small, max_text_bytes=10).texts == ["12345", "1234567890"]
    assert "line 2 is longer than 9 bytes" in str(load_or_refuse(small, max_text_bytes=9))


@pytest.mark.slow
def test_a_million_rows_are_streamed(tmp_path: Path) -> None:
    """Peak memory while loading ≈ the texts kept: no copy of the file, its decoded text or its lines."""
    n, m, pad = 1_000_000, 100_000, "p" * 200  # jsonl/csv: fewer rows, each with a wide unused column
    files = {"txt": tmp_path / "big.txt", "jsonl": tmp_path / "big.jsonl", "csv": tmp_path / "big.csv"}
    files["txt"].write_text("".join(f"text number {i}\n" for i in range(n)))
    files["jsonl"].write_text("".join(f'{{"text": "text {i}", "meta": "{pad}"}}\n' for i in range(m)))
    files["csv"].write_text("text,meta\n" + "".join(f'"text, {i}",{pad}\n' for i in range(m)))
    for kind, path in files.items():
        tracemalloc.start()
        try:
            ds = load_texts(path)
            kept, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(ds) == (n if kind == "txt" else m)
        # Reading the whole file would add at least its size (> 16 MiB) on top of what is kept.
        assert path.stat().st_size > 16 * MB
        assert peak - kept < 8 * MB, (kind, peak - kept)
        del ds


# ------------------------------------------------------------------------------------------ through the CLI


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_series(tmp_path_factory.mktemp("ckpt"), 1) / "epoch-1"


BAD_DATASETS = {
    "empty.csv": b"",
    "latin1.txt": b"ok\ncaf\xe9\n",
    "nocol.jsonl": b'{"body": "x"}\n',
    "blank.txt": b"\n \n\r\n",
    "ragged.csv": b"text,group\na,b\nc,d,e\n",
    "unterminated.csv": b'text\n"never closed\n',
    "notjson.jsonl": b'{"text": "a"}\n{"text": \n',
    "fake.parquet": b"PAR1 not really PAR1",
    "allnan.csv": b"text\n\n\"\"\n",
}


@pytest.mark.slow
def test_bad_datasets_fail_in_one_line_and_leave_the_store_unchanged(tmp_path, checkpoint):
    db = tmp_path / "gnq.duckdb"
    good = tmp_path / "good.txt"
    good.write_text("one text\nanother text\n")
    gnq("audit", "--checkpoints", checkpoint, "--data", good, "--db", db, "--name", "ok", "--max-length", 16,
        "--quiet")
    before = store_fingerprint(db)
    for name, data in BAD_DATASETS.items():
        path = tmp_path / name
        path.write_bytes(data)
        result = CliRunner().invoke(app, ["audit", "--checkpoints", str(checkpoint), "--data", str(path),
                                          "--db", str(db), "--name", "bad", "--max-length", "16", "--quiet"])
        lines = result.output.strip().splitlines()
        assert result.exit_code == 1 and len(lines) == 1, (name, result.output)
        assert lines[0].startswith(f"error: {path}"), lines[0]
    assert_store_unchanged(db, before)


@pytest.mark.slow
def test_nan_and_empty_texts_are_dropped_counted_and_reported(tmp_path, checkpoint):
    path = tmp_path / "holes.jsonl"  # json.loads reads NaN as a float NaN
    path.write_text('{"text": "kept one"}\n{"text": null}\n{"text": ""}\n{"text": "  "}\n{"text": NaN}\n'
                    '{"other": 1}\n{"text": "kept two"}\n{"text": "NaN"}\n')  # a string "NaN" is a text
    ds = load_texts(path)
    assert ds.texts == ["kept one", "kept two", "NaN"] and ds.dropped == 5
    csv = tmp_path / "holes.csv"
    csv.write_text('text,group\nkept,a\n,b\n"",c\n"   ",d\nNaN,e\n')
    assert load_texts(csv).texts == ["kept", "NaN"] and load_texts(csv).dropped == 3
    result = CliRunner().invoke(app, ["audit", "--checkpoints", str(checkpoint), "--data", str(path),
                                      "--db", str(tmp_path / "g.duckdb"), "--max-length", "16", "--quiet"])
    assert result.exit_code == 0, result.output
    assert f"{path}: skipped 5 row(s) whose text is missing, NaN or empty; 3 texts remain" in " ".join(
        result.output.split())
