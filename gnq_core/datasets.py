"""Text datasets for ``gnq train`` and ``gnq audit``: one loader for .txt, .jsonl, .csv and .parquet.

``load_texts(path)`` returns a :class:`TextDataset`: the example texts, an optional group label per
example, and the SHA-256 of the file's bytes (the dataset's identity, recorded with results).

Formats, chosen by extension (case-insensitive):

* ``.txt``: one example per line (split on ``"\\n"`` only; a trailing ``"\\r"`` is removed).
  Blank or whitespace-only lines are skipped and not counted as dropped. No columns, no groups.
* ``.jsonl``: one JSON object per line; blank lines skipped. A line that is not a JSON object is an error.
* ``.csv``: read with pandas (quoted fields may hold newlines, quotes and commas). Every field is
  read as a string, so ``"NA"`` or ``"007"`` stay as written.
* ``.parquet``: read with pyarrow.

The text column is ``text_column`` or ``"text"``; the group column is ``group_column``, else
``"group"`` when present, else none. Rows whose text is missing, NaN, empty or whitespace-only are
dropped (counted in ``TextDataset.dropped``); other non-string texts are converted with ``str()``.
Group values that are missing, NaN or empty become ``None``; others are converted with ``str()``.
Texts are otherwise kept exactly as stored.

Every problem raises :class:`DatasetError`, whose message is one line naming the file.
"""

from __future__ import annotations

import codecs
import hashlib
import io
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SUFFIXES", "DatasetError", "TextDataset", "file_sha256", "load_texts"]

SUFFIXES: tuple[str, ...] = (".txt", ".jsonl", ".csv", ".parquet")
DEFAULT_TEXT_COLUMN = "text"
DEFAULT_GROUP_COLUMN = "group"
_CHUNK = 1 << 20  # 1 MiB
_Rows = Callable[[str], list[Any]]  # column name -> its raw value in each row


class DatasetError(ValueError):
    """A dataset file could not be loaded. ``str()`` is one line: ``"<file>: <problem>"``."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(_one_line(f"{self.path}: {problem}"))


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

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def name(self) -> str:
        """The file's stem, e.g. ``"demo"`` for ``data/demo.csv``."""
        return self.path.stem


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def load_texts(
    path: str | Path, text_column: str | None = None, group_column: str | None = None
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
    try:
        data = p.read_bytes()
    except OSError as e:
        raise DatasetError(shown, f"cannot read file ({e.strerror or e})") from e
    if not data:
        raise DatasetError(shown, "file is empty")

    if suffix == ".txt":
        if text_column is not None or group_column is not None:
            raise DatasetError(
                shown, "a .txt file has no columns; text/group columns apply to .csv, .jsonl and .parquet"
            )
        lines = _decode(shown, data).split("\n")
        texts = [line.removesuffix("\r") for line in lines]
        texts = [t for t in texts if t.strip()]
        if not texts:
            raise DatasetError(shown, "no examples (every line is blank)")
        return TextDataset(
            path=p.resolve(),
            texts=texts,
            groups=[None] * len(texts),
            sha256=hashlib.sha256(data).hexdigest(),
            text_column=None,
            group_column=None,
        )

    if suffix == ".jsonl":
        columns, rows = _read_jsonl(shown, data)
    elif suffix == ".csv":
        columns, rows = _read_csv(shown, data)
    else:
        columns, rows = _read_parquet(shown, data, text_column, group_column)

    tcol = text_column if text_column is not None else DEFAULT_TEXT_COLUMN
    if tcol not in columns:
        hint = "" if text_column is not None else "; pass --text-column"
        raise DatasetError(shown, f"no column {tcol!r} ({_list_columns(columns)}){hint}")
    if group_column is not None:
        if group_column not in columns:
            raise DatasetError(shown, f"no column {group_column!r} for groups ({_list_columns(columns)})")
        gcol: str | None = group_column
    else:
        gcol = DEFAULT_GROUP_COLUMN if DEFAULT_GROUP_COLUMN in columns else None

    raw_texts = rows(tcol)
    raw_groups = rows(gcol) if gcol is not None else [None] * len(raw_texts)
    texts: list[str] = []
    groups: list[str | None] = []
    dropped = 0
    for i, (value, group) in enumerate(zip(raw_texts, raw_groups, strict=True)):
        text = _as_text(shown, value, tcol, i)
        if text is None or not text.strip():
            dropped += 1
            continue
        texts.append(text)
        groups.append(_as_group(shown, group, gcol, i))
    if not texts:
        what = f"all {dropped} rows have an empty text" if dropped else "no rows"
        raise DatasetError(shown, f"no examples ({what} in column {tcol!r})")
    return TextDataset(
        path=p.resolve(),
        texts=texts,
        groups=groups,
        sha256=hashlib.sha256(data).hexdigest(),
        text_column=tcol,
        group_column=gcol,
        dropped=dropped,
    )


def dataset_columns(path: str | Path) -> list[str]:
    """The columns a text/group column can be picked from ([] for .txt); errors as load_texts."""
    shown, p = str(path), Path(path)
    if p.suffix.lower() == ".txt":
        return []
    if p.suffix.lower() not in SUFFIXES or not p.is_file():
        load_texts(p)  # raises the same one-line error a load would
    data = p.read_bytes()
    if not data:
        raise DatasetError(shown, "file is empty")
    reader = {".jsonl": _read_jsonl, ".csv": _read_csv}.get(p.suffix.lower())
    columns = reader(shown, data)[0] if reader else _read_parquet(shown, data, None, None)[0]
    return list(columns)


# ----------------------------------------------------------------------------------------------------------
# Readers: each returns (column names, function column -> list of raw values, one per row).


def _read_jsonl(shown: str, data: bytes) -> tuple[list[str], _Rows]:
    text = _decode(shown, data)
    objects: list[dict[str, Any]] = []
    columns: dict[str, None] = {}  # ordered set: keys in order of first appearance
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(shown, f"line {lineno}: invalid JSON ({e.msg} at column {e.colno})") from e
        if not isinstance(obj, dict):
            raise DatasetError(shown, f"line {lineno}: expected a JSON object, got {type(obj).__name__}")
        objects.append(obj)
        columns.update(dict.fromkeys(obj))
    if not objects:
        raise DatasetError(shown, "no examples (every line is blank)")
    return list(columns), lambda col: [obj.get(col) for obj in objects]


def _read_csv(shown: str, data: bytes) -> tuple[list[str], _Rows]:
    import pandas as pd

    text = _decode(shown, data)
    try:
        df = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError as e:
        raise DatasetError(shown, "no examples (no header or rows)") from e
    except (pd.errors.ParserError, ValueError) as e:
        raise DatasetError(shown, f"could not parse CSV ({e})") from e
    columns = [str(c) for c in df.columns]
    if len(set(columns)) != len(columns):
        raise DatasetError(shown, f"duplicate column names ({_list_columns(columns)})")
    by_name = dict(zip(columns, df.columns, strict=True))
    return columns, lambda col: df[by_name[col]].tolist()


def _read_parquet(
    shown: str, data: bytes, text_column: str | None, group_column: str | None
) -> tuple[list[str], _Rows]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        columns = list(pf.schema_arrow.names)
        wanted = [
            c
            for c in dict.fromkeys([text_column or DEFAULT_TEXT_COLUMN, group_column or DEFAULT_GROUP_COLUMN])
            if c in columns
        ]
        table = pf.read(columns=wanted)
    except (pa.ArrowException, OSError) as e:
        raise DatasetError(shown, f"not a readable parquet file ({e})") from e
    return columns, lambda col: table.column(col).to_pylist()


# ----------------------------------------------------------------------------------------------------------
# Helpers.


def _decode(shown: str, data: bytes) -> str:
    """Strict UTF-8 (a leading BOM is allowed); errors name the byte offset in the file."""
    start = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[start:].decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        offset = start + e.start
        line = data.count(b"\n", 0, offset) + 1
        raise DatasetError(
            shown, f"not valid UTF-8: byte 0x{data[offset]:02x} at byte offset {offset} (line {line})"
        ) from e


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    try:
        import pandas as pd

        return value is pd.NA or value is pd.NaT
    except ImportError:  # pragma: no cover - pandas is a dependency
        return False


def _as_text(shown: str, value: Any, column: str, row: int) -> str | None:
    if _is_missing(value):
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as e:
            raise DatasetError(
                shown, f"row {row + 1}: column {column!r} holds bytes that are not UTF-8"
            ) from e
    return str(value)


def _as_group(shown: str, value: Any, column: str | None, row: int) -> str | None:
    if column is None:
        return None
    text = _as_text(shown, value, column, row)
    return text if text else None


def _list_columns(columns: Sequence[str]) -> str:
    return "columns: " + (", ".join(columns) if columns else "none")


def _one_line(message: str) -> str:
    return re.sub(r"\s*[\r\n\u2028\u2029\x0b\x0c\x1c-\x1e\x85]+\s*", " ", message).strip()
