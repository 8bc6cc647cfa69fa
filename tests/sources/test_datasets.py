"""gnq_core.sources.datasets: every format loads, every problem is a one-line DatasetError naming the file."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnq_core.sources.datasets import DatasetError, TextDataset, file_sha256, load_texts

# ---------------------------------------------------------------------------------------------- writers


def write_txt(path: Path, texts: list[str], newline: str = "\n") -> Path:
    path.write_bytes(newline.join(texts).encode("utf-8") + newline.encode())
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def write_csv(path: Path, rows: list[dict], columns: list[str] | None = None) -> Path:
    columns = columns or list(rows[0])
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(
            f, fieldnames=columns
        )  # lineterminator "\r\n": quotes any field with \r or \n
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_parquet(path: Path, columns: dict[str, list]) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def assert_error(path: Path, match: str, **kwargs) -> DatasetError:
    with pytest.raises(DatasetError) as info:
        load_texts(path, **kwargs)
    message = str(info.value)
    assert path.name in message
    assert "\n" not in message and "\r" not in message
    assert match in message, message
    return info.value


# ------------------------------------------------------------------------------------------ round trips


def test_txt_round_trip(tmp_path: Path) -> None:
    texts = ["first line", "  indented, with  inner  spaces ", "ünïcødé ✓ 日本語", "tabs\tinside"]
    ds = load_texts(write_txt(tmp_path / "a.txt", texts))
    assert isinstance(ds, TextDataset)
    assert ds.texts == texts
    assert ds.groups == [None] * 4
    assert ds.text_column is None and ds.group_column is None
    assert len(ds) == 4 and ds.name == "a" and ds.dropped == 0
    assert ds.path == (tmp_path / "a.txt").resolve()


def test_txt_crlf_blank_lines_and_bom(tmp_path: Path) -> None:
    path = tmp_path / "b.TXT"
    path.write_bytes(b"\xef\xbb\xbfone\r\n\r\n   \r\ntwo\r\nthree")
    ds = load_texts(path)
    assert ds.texts == ["one", "two", "three"]
    assert ds.dropped == 0


def test_txt_splits_only_on_newline(tmp_path: Path) -> None:
    texts = ["a\u2028b", "c\x0bd", "e\x85f"]  # str.splitlines would split these
    assert load_texts(write_txt(tmp_path / "s.txt", texts)).texts == texts


def test_jsonl_round_trip_with_unicode(tmp_path: Path) -> None:
    rows = [
        {"text": "Grüße aus Köln 🌍", "group": "de", "extra": 1},
        {"text": 'quotes " and \\ backslash\nand newline', "group": "en"},
        {"text": "日本語のテキスト", "group": None},
    ]
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    path.write_text(path.read_text(encoding="utf-8") + "\n  \n", encoding="utf-8")  # trailing blank lines
    ds = load_texts(path)
    assert ds.texts == [r["text"] for r in rows]
    assert ds.groups == ["de", "en", None]
    assert ds.text_column == "text" and ds.group_column == "group"


def test_csv_round_trip_with_embedded_newlines_and_quotes(tmp_path: Path) -> None:
    texts = ['He said "hello", then left.', "two\nlines", "crlf\r\ninside", "comma, separated", "NA", "007"]
    rows = [{"text": t, "group": g} for t, g in zip(texts, "ababab", strict=True)]
    ds = load_texts(write_csv(tmp_path / "d.csv", rows))
    assert ds.texts == texts  # "NA" and "007" stay as written
    assert ds.groups == list("ababab")


def test_parquet_round_trip(tmp_path: Path) -> None:
    texts = ["alpha", "beta\nwith newline", "γάμμα"]
    path = write_parquet(tmp_path / "e.parquet", {"text": texts, "group": ["x", None, "z"], "n": [1, 2, 3]})
    ds = load_texts(path)
    assert ds.texts == texts
    assert ds.groups == ["x", None, "z"]


def test_extension_is_case_insensitive(tmp_path: Path) -> None:
    ds = load_texts(write_csv(tmp_path / "UPPER.CSV", [{"text": "hi"}]))
    assert ds.texts == ["hi"] and ds.group_column is None


# ---------------------------------------------------------------------------------- columns and groups


def test_group_column_detected_only_when_present(tmp_path: Path) -> None:
    with_group = load_texts(
        write_csv(tmp_path / "g.csv", [{"text": "a", "group": "1"}, {"text": "b", "group": ""}])
    )
    assert with_group.group_column == "group" and with_group.groups == ["1", None]
    without = load_texts(write_csv(tmp_path / "n.csv", [{"text": "a", "label": "1"}]))
    assert without.group_column is None and without.groups == [None]


def test_text_and_group_column_options(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "opts.jsonl", [{"body": "x", "cat": 3, "group": "ignored"}, {"body": "y", "cat": 4.5}]
    )
    ds = load_texts(path, text_column="body", group_column="cat")
    assert ds.texts == ["x", "y"]
    assert ds.groups == ["3", "4.5"]
    assert ds.text_column == "body" and ds.group_column == "cat"


def test_parquet_text_column_option_and_numbers(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "num.parquet", {"value": [1, 22, 333], "group": [1.0, math.nan, 3.0]})
    ds = load_texts(path, text_column="value")
    assert ds.texts == ["1", "22", "333"]
    assert ds.groups == ["1.0", None, "3.0"]


def test_missing_and_empty_texts_dropped(tmp_path: Path) -> None:
    rows = [
        {"text": "keep"},
        {"text": ""},
        {"text": "   "},
        {"text": None},
        {"text": float("nan")},
        {"other": 1},
    ]
    ds = load_texts(write_jsonl(tmp_path / "drop.jsonl", rows))
    assert ds.texts == ["keep"] and ds.dropped == 5
    pq_path = write_parquet(
        tmp_path / "drop.parquet", {"text": ["a", None, " \t", "b"], "group": ["1", "2", "3", "4"]}
    )
    ds = load_texts(pq_path)
    assert ds.texts == ["a", "b"] and ds.groups == ["1", "4"] and ds.dropped == 2
    csv_path = tmp_path / "drop.csv"
    csv_path.write_text('text,group\nx,1\n,2\n"  ",3\ny,4\n', encoding="utf-8")
    ds = load_texts(csv_path)
    assert ds.texts == ["x", "y"] and ds.groups == ["1", "4"] and ds.dropped == 2


def test_sha256_identifies_content(tmp_path: Path) -> None:
    path = write_txt(tmp_path / "h.txt", ["one", "two"])
    first = load_texts(path)
    assert first.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() == file_sha256(path)
    write_txt(path, ["one", "three"])
    assert load_texts(path).sha256 != first.sha256
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * 9000)  # > 2 MiB: several chunks
    assert file_sha256(big) == hashlib.sha256(big.read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------------------ errors


def test_error_missing_file(tmp_path: Path) -> None:
    assert_error(tmp_path / "nope.csv", "no such file")


def test_error_directory(tmp_path: Path) -> None:
    (tmp_path / "folder.csv").mkdir()
    assert_error(tmp_path / "folder.csv", "directory")


def test_error_unknown_extension(tmp_path: Path) -> None:
    path = tmp_path / "data.xlsx"
    path.write_text("text\nx\n")
    assert_error(path, "unknown extension '.xlsx'")
    bare = tmp_path / "noext"
    bare.write_text("x\n")
    assert_error(bare, "no file extension")


@pytest.mark.parametrize("suffix", [".txt", ".jsonl", ".csv", ".parquet"])
def test_error_empty_file(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"empty{suffix}"
    path.write_bytes(b"")
    assert_error(path, "empty")


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("blank.txt", "\n  \n\r\n"),
        ("blank.jsonl", "\n\n"),
        ("header.csv", "text,group\n"),
        ("ws.csv", "\n \n"),
    ],
)
def test_error_no_examples(tmp_path: Path, name: str, content: str) -> None:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    assert_error(path, "no examples")


def test_error_all_texts_empty(tmp_path: Path) -> None:
    assert_error(write_jsonl(tmp_path / "e.jsonl", [{"text": ""}, {"text": None}]), "no examples (all 2 rows")
    assert_error(
        write_parquet(tmp_path / "e.parquet", {"text": pa.array([None, None], pa.string())}), "no examples"
    )


@pytest.mark.parametrize("suffix", [".txt", ".jsonl", ".csv"])
def test_error_non_utf8_names_byte_offset(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"latin1{suffix}"
    prefix = {".txt": b"ok\n", ".jsonl": b'{"text": "ok"}\n', ".csv": b"text\nok\n"}[suffix]
    path.write_bytes(prefix + b"caf\xe9\n")
    offset, line = len(prefix) + 3, prefix.count(b"\n") + 1
    assert_error(path, f"byte 0xe9 at byte offset {offset} (line {line})")


def test_error_non_utf8_offset_counts_bom(tmp_path: Path) -> None:
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbfab\xff")
    assert_error(path, "byte offset 5")


def test_error_jsonl_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "a"}\n\n{"text": broken\n', encoding="utf-8")
    assert_error(path, "line 3: invalid JSON")
    path.write_text('{"text": "a"}\n["a", "list"]\n', encoding="utf-8")
    assert_error(path, "line 2: expected a JSON object, got list")
    path.write_text('"just a string"\n', encoding="utf-8")
    assert_error(path, "line 1:")


def test_error_missing_text_column_lists_columns(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "cols.csv", [{"a": "1", "b": "2"}])
    assert_error(path, "no column 'text' (columns: a, b); pass --text-column")
    assert_error(path, "no column 'body' (columns: a, b)", text_column="body")
    pq_path = write_parquet(tmp_path / "cols.parquet", {"a": ["x"], "b": ["y"]})
    assert_error(pq_path, "no column 'text' (columns: a, b)")


def test_error_missing_group_column(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "grp.jsonl", [{"text": "a", "label": "x"}])
    assert_error(path, "no column 'cat' for groups (columns: text, label)", group_column="cat")


def test_error_columns_for_txt(tmp_path: Path) -> None:
    path = write_txt(tmp_path / "plain.txt", ["a"])
    assert_error(path, "no columns", text_column="text")
    assert_error(path, "no columns", group_column="group")


def test_ragged_csv_refused_with_line_number(tmp_path: Path) -> None:
    """An unquoted comma in the first data row made pandas take the first field as
    the index and drop 6 of 7 texts; now the row is refused by line, whatever its position."""
    path = tmp_path / "texts.csv"
    path.write_text("text\nhello, world\n" + "".join(f"text {i}\n" for i in range(6)), encoding="utf-8")
    assert_error(path, "texts.csv:2: 2 fields, header has 1")
    short = tmp_path / "short.csv"
    short.write_text("text,group\na,1\n\"two\nlines\",2\nonly\n", encoding="utf-8")
    assert_error(short, "short.csv:5: 1 field, header has 2")  # line counted past the quoted newline
    quotes = tmp_path / "quotes.csv"
    quotes.write_text('text\n"ok"\n"bad"tail\n', encoding="utf-8")
    assert_error(quotes, "quotes.csv:3: malformed CSV")


def test_error_malformed_csv_and_parquet(tmp_path: Path) -> None:
    path = tmp_path / "ragged.csv"
    path.write_text("text,group\na,b\nc,d,e,f\n", encoding="utf-8")
    assert_error(path, "ragged.csv:3: 4 fields, header has 2")
    fake = tmp_path / "fake.parquet"
    fake.write_bytes(b"this is not parquet at all\n" * 4)
    assert_error(fake, "not a readable parquet file")


# -------------------------------------------------------------------------------------------- properties

ANY_TEXT = st.text(min_size=1).filter(lambda s: s.strip())
LINE_TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\n\r"), min_size=1).filter(
    lambda s: s.strip()
)
GROUPS = st.none() | st.text(min_size=1)
FAST = settings(max_examples=30, deadline=None)


@FAST
@given(st.lists(LINE_TEXT, min_size=1, max_size=20))
def test_property_txt_round_trip(texts: list[str]) -> None:
    with tempfile.TemporaryDirectory() as d:
        assert load_texts(write_txt(Path(d) / "p.txt", texts)).texts == texts


@FAST
@given(
    st.sampled_from([".jsonl", ".csv", ".parquet"]),
    st.lists(st.tuples(ANY_TEXT, GROUPS), min_size=1, max_size=20),
)
def test_property_tabular_round_trip(suffix: str, rows: list[tuple[str, str | None]]) -> None:
    # hypothesis re-runs the body many times, so each run gets its own directory (not the shared tmp_path).
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"p{suffix}"
        if suffix == ".jsonl":
            write_jsonl(path, [{"text": t, "group": g} for t, g in rows])
        elif suffix == ".csv":
            write_csv(path, [{"text": t, "group": g} for t, g in rows])
        else:
            write_parquet(path, {"text": [t for t, _ in rows], "group": [g for _, g in rows]})
        ds = load_texts(path)
    assert ds.texts == [t for t, _ in rows]
    assert ds.groups == [g or None for _, g in rows]
    assert ds.dropped == 0
