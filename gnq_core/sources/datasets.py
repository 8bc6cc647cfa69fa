"""Text datasets for ``gnq train`` and ``gnq audit``: one loader for .txt, .jsonl, .csv and .parquet.

``load_texts(path)`` returns a :class:`TextDataset`: the example texts, an optional group label per
example, and the SHA-256 of the file's bytes (the dataset's identity, recorded with results).

Formats, chosen by extension (case-insensitive):

* ``.txt``: one example per line (split on ``"\\n"`` only; a trailing ``"\\r"`` is removed).
  Blank or whitespace-only lines are skipped and not counted as dropped. No columns, no groups.
* ``.jsonl``: one JSON object per line; blank lines skipped. A line that is not a JSON object is an error.
* ``.csv``: read with Python's csv module, strictly (quoted fields may hold newlines, quotes and
  commas). Every field is read as a string, so ``"NA"`` or ``"007"`` stay as written. A record
  whose field count differs from the header's, or malformed quoting, is refused with its line
  (``file.csv:2: 2 fields, header has 1``) rather than guessed at.
* ``.parquet``: read with pyarrow.

The text column is ``text_column`` or ``"text"``; the group column is ``group_column``, else
``"group"`` when present, else none. Rows whose text is missing, NaN, empty or whitespace-only are
dropped (counted in ``TextDataset.dropped``); numbers and booleans are converted with ``str()``;
a list, dict or array (nested Parquet/JSONL values) is refused.
Group values that are missing, NaN or empty become ``None``; others are converted with ``str()``.
Texts are otherwise kept exactly as stored.

Large files are streamed, never read whole: one pass hashes the bytes and checks the UTF-8 and
the line lengths, a second parses record by record (.txt, .jsonl, .csv) or in
record batches (.parquet), keeping only the text and group values.  A line or a text longer than
``max_text_bytes`` (default 8 MiB, or ``$GNQ_MAX_TEXT_BYTES``) is refused with its line or row
number instead of being tokenised: GNQ reads at most ``--max-length`` tokens of a text anyway.

Every problem raises :class:`DatasetError`, whose message is one line naming the file.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gnq_core.errors import GNQError, one_line
from gnq_core.sources.limits import env_int

__all__ = ["MAX_TEXT_BYTES", "SUFFIXES", "DatasetError", "TextDataset", "dataset_columns", "file_sha256",
           "load_texts", "public_cell_flag", "secret_cell_values"]

SUFFIXES: tuple[str, ...] = (".txt", ".jsonl", ".csv", ".parquet")
DEFAULT_TEXT_COLUMN = "text"
DEFAULT_GROUP_COLUMN = "group"
_CHUNK = 1 << 20  # 1 MiB
_PARQUET_ROWS = 50_000  # rows per pyarrow record batch
MAX_TEXT_BYTES = 8 << 20  # default limit on one line / one text (8 MiB)
_SURROGATE = re.compile("[\ud800-\udfff]")  # half of a UTF-16 pair: no text holds one alone
_Rows = Callable[[str], list[Any]]  # column name -> its raw value in each row


class DatasetError(GNQError, ValueError):
    """A dataset file could not be loaded. ``str()`` is one line: ``"<file>: <problem>"``."""

    def __init__(self, path: str | Path, problem: str, *, line: int | None = None) -> None:
        self.path = str(path)
        self.problem = problem
        self.line = line
        where = self.path if line is None else f"{self.path}:{line}"  # file.csv:2: as compilers do
        super().__init__(one_line(f"{where}: {problem}", whole=True))


@dataclass(frozen=True)
class TextDataset:
    """Example texts loaded from one file, with optional group labels."""

    path: Path  # resolved path
    texts: list[str]
    groups: list[str | None]  # same length as texts; all None when there is no group column
    sha256: str  # hex digest of the file's bytes
    text_column: str | None  # None for .txt
    group_column: str | None
    dropped: int = 0  # rows dropped because their text was missing, empty or whitespace-only
    # per text, its private values (--secret-column) and whether it is public
    # (--public-column); None: no such column
    secret_values: list[list[str]] | None = None
    public: list[bool] | None = None
    secret_column: str | None = None
    public_column: str | None = None
    secret_patterns: tuple[str, ...] = ()  # --secret-pattern: regexes of private values

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def name(self) -> str:
        """The file's stem, e.g. ``"demo"`` for ``data/demo.csv``."""
        return self.path.stem


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def load_texts(
    path: str | Path,
    text_column: str | None = None,
    group_column: str | None = None,
    *,
    max_text_bytes: int | None = None,
    secret_column: str | None = None,
    public_column: str | None = None,
) -> TextDataset:
    """Load the examples of a .txt, .jsonl, .csv or .parquet file (see the module docstring)."""
    shown = str(path)
    p = Path(path)
    suffix = p.suffix.lower()
    if not p.exists():
        raise DatasetError(shown, "no such file")
    if p.is_dir():
        raise DatasetError(shown, "is a directory, not a dataset file")
    if suffix not in SUFFIXES:
        kind = f"unknown extension {p.suffix!r}" if p.suffix else "no file extension"
        raise DatasetError(shown, f"{kind}; supported: {', '.join(SUFFIXES)}")
    _check_not_empty(shown, p)
    columns_named = (text_column, group_column, secret_column, public_column)
    if suffix == ".txt" and any(c is not None for c in columns_named):
        raise DatasetError(
            shown, "a .txt file has no columns; text/group columns apply to .csv, .jsonl and .parquet"
        )
    limit = max_text_bytes if max_text_bytes is not None else _max_text_bytes()
    sha256 = _scan(shown, p, limit, text=suffix != ".parquet")

    if suffix == ".txt":
        texts = [t for t in _lines(shown, p) if t.strip()]
        if not texts:
            raise DatasetError(shown, "no examples (every line is blank)")
        return TextDataset(
            path=p.resolve(),
            texts=texts,
            groups=[None] * len(texts),
            sha256=sha256,
            text_column=None,
            group_column=None,
        )

    wanted = [text_column or DEFAULT_TEXT_COLUMN, group_column or DEFAULT_GROUP_COLUMN,
              *(c for c in (secret_column, public_column) if c is not None)]
    columns, rows = _READERS[suffix](shown, p, wanted)

    tcol = text_column if text_column is not None else DEFAULT_TEXT_COLUMN
    if tcol not in columns:
        hint = "" if text_column is not None else "; pass --text-column"
        raise DatasetError(shown, f"no column {tcol!r} ({_list_columns(columns)}){hint}")
    for what, col in (("groups", group_column), ("--secret-column", secret_column),
                      ("--public-column", public_column)):
        if col is not None and col not in columns:
            raise DatasetError(shown, f"no column {col!r} for {what} ({_list_columns(columns)})")
    gcol = group_column if group_column is not None else (
        DEFAULT_GROUP_COLUMN if DEFAULT_GROUP_COLUMN in columns else None)
    raw_texts = rows(tcol)
    raw_groups = rows(gcol) if gcol is not None else [None] * len(raw_texts)
    raw_secrets = rows(secret_column) if secret_column is not None else [None] * len(raw_texts)
    raw_public = rows(public_column) if public_column is not None else [None] * len(raw_texts)
    texts: list[str] = []
    groups: list[str | None] = []
    secrets: list[list[str]] = []
    public: list[bool] = []
    dropped = 0
    for i, (value, group, secret, pub) in enumerate(zip(raw_texts, raw_groups, raw_secrets, raw_public,
                                                         strict=True)):
        text = _as_text(shown, value, tcol, i)
        if text is None or not text.strip():
            dropped += 1
            continue
        if len(text) > limit // 4 and (size := len(text.encode("utf-8", "surrogatepass"))) > limit:
            raise DatasetError(shown, f"row {i + 1}: the text is {size:,} bytes, above the limit of "
                                      f"{limit:,} per text (GNQ reads at most --max-length tokens of it; "
                                      "shorten or split it, or raise GNQ_MAX_TEXT_BYTES)")
        texts.append(text)
        groups.append((_as_text(shown, group, gcol, i) or None) if gcol is not None else None)
        if secret_column is not None:  # lists only when asked: a million empty ones cost ~56 MB
            secrets.append(secret_cell_values(secret))
        if public_column is not None:
            public.append(public_cell_flag(shown, pub, public_column, i))
    if not texts:
        what = f"all {dropped} rows have an empty text" if dropped else "no rows"
        raise DatasetError(shown, f"no examples ({what} in column {tcol!r})")
    return TextDataset(path=p.resolve(), texts=texts, groups=groups, sha256=sha256, text_column=tcol,
                       group_column=gcol, dropped=dropped,
                       secret_values=secrets if secret_column is not None else None,
                       public=public if public_column is not None else None,
                       secret_column=secret_column, public_column=public_column)


def secret_cell_values(value: Any) -> list[str]:
    """A --secret-column cell as its values: a list (JSON, Parquet) or a string of them separated
    by ';' ; empty or missing: none."""
    if value is None or (isinstance(value, float) and value != value):
        return []
    items = list(value) if isinstance(value, (list, tuple)) else str(value).split(";")
    return [str(v).strip() for v in items if v is not None and str(v).strip()]


_TRUE, _FALSE = {"true", "yes", "y", "1", "public", "t"}, {"false", "no", "n", "0", "private", "f", ""}


def public_cell_flag(shown: str, value: Any, column: str | None, row: int) -> bool:
    """A --public-column cell: true/yes/1/public or false/no/0/private/empty."""
    if column is None or value is None or (isinstance(value, float) and value != value):
        return False
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise DatasetError(shown, f"row {row + 1}: column {column!r} is {value!r}; --public-column takes "
                              "true/false, yes/no, 1/0 or public/private")


def dataset_columns(path: str | Path) -> list[str]:
    """The columns a text/group column can be picked from ([] for .txt); errors as load_texts."""
    shown, p = str(path), Path(path)
    if p.suffix.lower() == ".txt":
        return []
    if p.suffix.lower() not in SUFFIXES or not p.is_file():
        load_texts(p)  # raises the same one-line error a load would
    _check_not_empty(shown, p)
    if p.suffix.lower() != ".parquet":
        _scan(shown, p, _max_text_bytes(), text=True)
    return list(_READERS[p.suffix.lower()](shown, p, [])[0])


# ----------------------------------------------------------------------------------------------------------
# Readers: each returns (column names, function column -> list of raw values, one per row).


def _lines(shown: str, path: Path) -> Iterator[str]:
    """The file's lines, split on "\\n" only, without the "\\n" or a trailing "\\r" (BOM removed);
    read and decoded 1 MiB at a time (the file was already checked to be UTF-8 with bounded lines)."""
    pending = b""  # the line still open at the end of the last chunk
    try:
        with open(path, "rb") as f:
            first = f.read(_CHUNK)
            chunk = first[len(codecs.BOM_UTF8):] if first.startswith(codecs.BOM_UTF8) else first
            while chunk:
                data = pending + chunk
                cut = data.rfind(b"\n") + 1
                pending = data[cut:]
                for line in data[:cut].decode("utf-8").split("\n")[:-1]:
                    yield line.removesuffix("\r")
                chunk = f.read(_CHUNK)
    except OSError as e:
        raise DatasetError(shown, f"cannot read file ({e.strerror or e})") from e
    if pending:
        yield pending.decode("utf-8").removesuffix("\r")


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict, refusing a key given twice: ``json`` would keep the last
    value without a word (CSV and Parquet refuse a duplicate column too)."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


def _read_jsonl(shown: str, path: Path, wanted: Sequence[str]) -> tuple[list[str], _Rows]:
    values: dict[str, list[Any]] = {c: [] for c in wanted}
    columns: dict[str, None] = {}  # ordered set: keys in order of first appearance
    n = 0
    for lineno, line in enumerate(_lines(shown, path), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, object_pairs_hook=_unique_keys)
        except _DuplicateKey as e:
            raise DatasetError(shown, f"line {lineno}: the key {e.key!r} is given twice in one object (JSON "
                                      "keeps the last silently); keep one") from None
        except json.JSONDecodeError as e:
            raise DatasetError(shown, f"line {lineno}: invalid JSON ({e.msg} at column {e.colno})") from e
        except RecursionError as e:
            raise DatasetError(shown, f"line {lineno}: JSON nested too deeply") from e
        except ValueError as e:  # a number of more than 4,300 digits (Python's int conversion limit)
            raise DatasetError(shown, f"line {lineno}: unreadable JSON value ({e})") from e
        if not isinstance(obj, dict):
            raise DatasetError(shown, f"line {lineno}: expected a JSON object, got {type(obj).__name__}")
        columns.update(dict.fromkeys(obj))
        for c, column in values.items():
            column.append(obj.get(c))
        n += 1
    if not n:
        raise DatasetError(shown, "no examples (every line is blank)")
    return list(columns), values.__getitem__


def _read_csv(shown: str, path: Path, wanted: Sequence[str]) -> tuple[list[str], _Rows]:
    """Python's csv module, strict: every record must have as many fields as the header (a ragged
    row is refused with its line number, never reinterpreted), quotes must be well formed.  Blank
    lines are skipped.  Fields are kept as written (no NA guessing)."""
    import csv

    limit = _max_text_bytes()
    csv.field_size_limit(max(csv.field_size_limit(), limit))  # a quoted field may span many lines
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f, strict=True)
            start = 1  # physical line where the record being read starts
            try:
                columns = next(reader, None)
                while columns is not None and _blank(columns):  # blank lines before the header
                    start = reader.line_num + 1
                    columns = next(reader, None)
                if columns is None:
                    raise DatasetError(shown, "no examples (no header or rows)")
                if len(set(columns)) != len(columns):
                    raise DatasetError(shown, f"duplicate column names ({_list_columns(columns)})")
                keep = {c: columns.index(c) for c in dict.fromkeys(wanted) if c in columns}
                values: dict[str, list[Any]] = {c: [] for c in keep}
                start = reader.line_num + 1
                for record in reader:
                    # a one-column file's whitespace-only line is a row with a blank text: dropped
                    # and counted like any other, not skipped unseen
                    if not _blank(record) or (len(columns) == 1 and record and record[0]):
                        if len(record) != len(columns):
                            raise DatasetError(shown, f"{_fields(len(record))}, header has "
                                                      f"{len(columns)}", line=start)
                        for c, i in keep.items():
                            values[c].append(record[i])
                    start = reader.line_num + 1
            except csv.Error as e:
                raise DatasetError(shown, f"malformed CSV ({e})", line=start) from e
    except OSError as e:
        raise DatasetError(shown, f"cannot read file ({e.strerror or e})") from e
    return columns, values.__getitem__


def _blank(record: list[str]) -> bool:
    """A blank or whitespace-only line (skipped, as pandas and the .txt/.jsonl readers do)."""
    return len(record) <= 1 and not "".join(record).strip()


def _fields(n: int) -> str:
    return f"{n} field" + ("" if n == 1 else "s")


def _read_parquet(shown: str, path: Path, wanted: Sequence[str]) -> tuple[list[str], _Rows]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with pq.ParquetFile(path) as pf:
            columns = list(pf.schema_arrow.names)
            if len(set(columns)) != len(columns):  # pyarrow cannot tell them apart (KeyError)
                raise DatasetError(shown, f"duplicate column names ({_list_columns(columns)})")
            keep = [c for c in dict.fromkeys(wanted) if c in columns]
            values: dict[str, list[Any]] = {c: [] for c in keep}
            if keep:
                for batch in pf.iter_batches(batch_size=_PARQUET_ROWS, columns=keep):
                    for c in keep:
                        values[c].extend(batch.column(c).to_pylist())
    except DatasetError:
        raise
    except (pa.ArrowException, OSError, ValueError, IndexError, TypeError, KeyError) as e:
        raise DatasetError(shown, f"not a readable parquet file ({e})") from e
    return columns, values.__getitem__


_READERS = {".jsonl": _read_jsonl, ".csv": _read_csv, ".parquet": _read_parquet}


# ----------------------------------------------------------------------------------------------------------
# Helpers.


def _max_text_bytes() -> int:
    return env_int("GNQ_MAX_TEXT_BYTES", MAX_TEXT_BYTES, unit="a number of bytes")


def _check_not_empty(shown: str, path: Path) -> None:
    try:
        size = path.stat().st_size
    except OSError as e:
        raise DatasetError(shown, f"cannot read file ({e.strerror or e})") from e
    if size == 0:
        raise DatasetError(shown, "file is empty")


def _scan(shown: str, path: Path, limit: int, *, text: bool) -> str:
    """SHA-256 of the file's bytes, read in 1 MiB chunks.  For a text format also: strict UTF-8
    (a leading BOM is allowed; an error names the byte offset and line) and no line longer than
    ``limit`` bytes (refused as soon as one is seen, so a huge line is never held in memory)."""
    digest = hashlib.sha256()
    offset = newlines = line_length = 0  # bytes before `chunk`, "\\n" before it, length of the open line
    carry = b""  # the start of a UTF-8 sequence cut by the chunk boundary
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
                if not text:
                    continue
                data = carry + chunk
                base = offset - len(carry)
                start = len(codecs.BOM_UTF8) if base == 0 and data.startswith(codecs.BOM_UTF8) else 0
                try:
                    data[start:].decode("utf-8")
                    carry = b""
                except UnicodeDecodeError as e:
                    bad = start + e.start
                    if e.reason == "unexpected end of data" and len(data) - bad < 4:
                        carry = data[bad:]  # completed by the next chunk (or an error at EOF)
                    else:
                        line = newlines + data.count(b"\n", 0, bad) + 1
                        raise DatasetError(shown, f"not valid UTF-8: byte 0x{data[bad]:02x} at byte offset "
                                                  f"{base + bad} (line {line})") from e
                line_length = _check_lines(shown, chunk, line_length, newlines, limit)
                newlines += chunk.count(b"\n")
                offset += len(chunk)
    except OSError as e:
        raise DatasetError(shown, f"cannot read file ({e.strerror or e})") from e
    if carry:
        raise DatasetError(shown, f"not valid UTF-8: byte 0x{carry[0]:02x} at byte offset "
                                  f"{offset - len(carry)} (line {newlines + 1}; the file ends mid-character)")
    return digest.hexdigest()


def _check_lines(shown: str, chunk: bytes, open_length: int, newlines: int, limit: int) -> int:
    """Refuse a line longer than ``limit``; returns the length of the line still open after ``chunk``."""
    first = chunk.find(b"\n")
    if first < 0 or limit < len(chunk):  # the slow path: every line of the chunk
        start, lineno = 0, newlines + 1
        while True:
            end = chunk.find(b"\n", start)
            length = open_length + ((end if end >= 0 else len(chunk)) - start)
            if length > limit:
                _line_too_long(shown, lineno, limit)
            if end < 0:
                return length
            start, open_length, lineno = end + 1, 0, lineno + 1
    # Lines wholly inside the chunk are shorter than the chunk, hence than the limit: only the line
    # the chunk closes and the one it leaves open can be too long.
    if open_length + first > limit:
        _line_too_long(shown, newlines + 1, limit)
    return len(chunk) - chunk.rfind(b"\n") - 1


def _line_too_long(shown: str, lineno: int, limit: int) -> None:
    raise DatasetError(shown, f"line {lineno} is longer than {limit:,} bytes, the limit per line (GNQ reads "
                              "at most --max-length tokens of a text; shorten or split it, or raise "
                              "GNQ_MAX_TEXT_BYTES)")


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    import pandas as pd

    return value is pd.NA or value is pd.NaT


def _as_text(shown: str, value: Any, column: str, row: int) -> str | None:
    if _is_missing(value):
        return None
    if isinstance(value, str):
        if not value.isascii() and (bad := _SURROGATE.search(value)):  # JSON's "\ud800": no character
            raise DatasetError(shown, f"row {row + 1}: column {column!r} holds a lone surrogate "
                                      f"(\\u{ord(bad.group()):04x}), not valid Unicode")
        return value
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as e:
            raise DatasetError(
                shown, f"row {row + 1}: column {column!r} holds bytes that are not UTF-8"
            ) from e
    if isinstance(value, dict | list | tuple) or hasattr(value, "__array__"):
        # a nested value would be audited as its Python repr ("['a', 'b']"): refused, not guessed at
        raise DatasetError(shown, f"row {row + 1}: column {column!r} holds a {type(value).__name__}, not a "
                                  "text; flatten it into one string per row")
    return str(value)


def _list_columns(columns: Sequence[str]) -> str:
    return "columns: " + (", ".join(columns) if columns else "none")
