"""A dataset file written again with character spans of some fields replaced and some records
left out, everything else kept as it was: the cleaned training data of ``gnq remediate``.

Edits address the original record and a field path inside it (``FieldEdit``): the record's index
among the file's records (``.txt``/``.jsonl``: its line, blank lines counted; ``.csv``: its data
record after the header; ``.parquet``: its row) and the path to a string value (``()`` for a
``.txt`` line, ``("text",)`` for a column, ``("messages", 2, "content")`` for a structured one).
A span is in the characters of the decoded value.

What is kept byte for byte: for the text formats every record not edited or dropped, and in an
edited record every other field and every character of the edited value outside its spans (the
replacement is spliced into the field's raw JSON string or CSV field, escapes and quoting as the
file had them); line endings, a byte-order mark and the header as they were.  A Parquet file is
rewritten by pyarrow with the same schema, metadata and compression: every value outside the
spans is equal, the bytes of the file are pyarrow's.
"""

from __future__ import annotations

import codecs
import copy
import csv
import io
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gnq_core.sources.datasets import SUFFIXES, DatasetError

__all__ = ["FieldEdit", "FieldPath", "field_values", "rewrite_dataset"]

FieldPath = tuple[str | int, ...]


@dataclass(frozen=True)
class FieldEdit:
    """Characters ``start``..``end`` of the string at ``path`` in record ``record`` become ``new``."""

    record: int
    path: FieldPath
    start: int
    end: int
    new: str


def field_values(path: str | Path, field: FieldPath) -> list[Any]:
    """The value at ``field`` of every record of the file, in record order (None where absent)."""
    p = Path(path)
    return [r.value(field) for r in _document(p).records]


def rewrite_dataset(source: str | Path, target: str | Path, edits: Sequence[FieldEdit],
                    drop: set[int] | frozenset[int] = frozenset()) -> None:
    """Write ``source`` to ``target`` with ``edits`` applied and the records of ``drop`` left out.
    Spans of one field must not overlap; an edit of a value that is not a string is refused."""
    doc = _document(Path(source))
    by_record: dict[int, list[FieldEdit]] = {}
    for e in edits:
        if not 0 <= e.record < len(doc.records):
            raise DatasetError(str(source), f"no record {e.record} to edit ({len(doc.records)} records)")
        by_record.setdefault(e.record, []).append(e)
    doc.write(Path(target), by_record, set(drop))


def _spliced(value: str, edits: list[FieldEdit]) -> list[tuple[int, int, str]]:
    """The edits of one value, checked (inside it, not overlapping), last first."""
    spans = sorted(((e.start, e.end, e.new) for e in edits), reverse=True)
    end = len(value)
    for a, b, _ in spans:
        if not 0 <= a <= b <= end:
            raise ValueError(f"span {a}..{b} is outside its value or overlaps another")
        end = a
    return spans


# ------------------------------------------------------------------------------------------ records
class _Record(ABC):
    @abstractmethod
    def value(self, field: FieldPath) -> Any:
        """The record's value at ``field``."""


class _Document(ABC):
    records: list[_Record]
    path: Path

    @abstractmethod
    def write(self, target: Path, edits: dict[int, list[FieldEdit]], drop: set[int]) -> None:
        """The file again at ``target``: records in ``drop`` left out, those in ``edits`` edited."""

    def _kept(self, edits: dict[int, list[FieldEdit]], drop: set[int],
              original: Callable[[int, Any], Any]) -> Iterator[Any]:
        """Each kept record's piece of the output: edited, or ``original(i, record)`` as it stood."""
        for i, record in enumerate(self.records):
            if i in drop:
                continue
            if i not in edits:
                yield original(i, record)
                continue
            try:
                yield record.edited(edits[i])
            except ValueError as e:
                raise DatasetError(str(self.path), f"record {i + 1}: {e}") from e


def _document(path: Path) -> _Document:
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise DatasetError(str(path), f"cannot rewrite a {suffix or 'suffix-less'} file "
                                      f"(supported: {', '.join(SUFFIXES)})")
    try:
        if suffix == ".parquet":
            return _ParquetDocument(path)
        raw = path.read_bytes()
    except OSError as e:
        raise DatasetError(str(path), f"cannot read file ({e.strerror or e})") from e
    return {".txt": _TextDocument, ".jsonl": _JsonlDocument, ".csv": _CsvDocument}[suffix](path, raw)


def _lines(raw: bytes) -> list[bytes]:
    """The file's lines with their "\\n" (split on "\\n" only, as the loader reads them)."""
    parts = raw.split(b"\n")
    lines = [p + b"\n" for p in parts[:-1]]
    return lines + ([parts[-1]] if parts[-1] else [])


def _body(line: bytes) -> tuple[bytes, bytes]:
    """(the line without its ending, the ending: "\\r\\n", "\\n" or nothing)."""
    for ending in (b"\r\n", b"\n"):
        if line.endswith(ending):
            return line[: -len(ending)], ending
    return line, b""


class _LineRecord(_Record):
    def __init__(self, raw: bytes, bom: bytes = b"") -> None:
        self.bom = bom
        body, self.ending = _body(raw[len(bom):])
        self.body = body.decode("utf-8")


class _TextLine(_LineRecord):
    def value(self, field: FieldPath) -> Any:
        return self.body if field == () else None

    def edited(self, edits: list[FieldEdit]) -> bytes:
        text = self.body
        for e in edits:
            if e.path != ():
                raise ValueError("a .txt line has no fields; its path is ()")
        for a, b, new in _spliced(text, edits):
            text = text[:a] + new + text[b:]
        return self.bom + text.encode("utf-8") + self.ending


class _LinesDocument(_Document):
    record_type: type[_LineRecord]

    def __init__(self, path: Path, raw: bytes) -> None:
        self.path = path
        lines = _lines(raw)
        bom = codecs.BOM_UTF8 if raw.startswith(codecs.BOM_UTF8) else b""
        try:
            self.records = [self.record_type(line, bom if i == 0 else b"") for i, line in enumerate(lines)]
        except (UnicodeDecodeError, ValueError) as e:
            raise DatasetError(str(path), f"cannot read it again to rewrite it ({e})") from e
        self.raw = lines

    def write(self, target: Path, edits: dict[int, list[FieldEdit]], drop: set[int]) -> None:
        with open(target, "wb") as f:
            f.writelines(self._kept(edits, drop, lambda i, _: self.raw[i]))


class _TextDocument(_LinesDocument):
    record_type = _TextLine


# ---------------------------------------------------------------------------------------- JSON lines
_DECODER = json.JSONDecoder()
_WS = " \t\n\r"


def _skip(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def _value_span(s: str, i: int) -> tuple[int, int]:
    """(start, end) of the JSON value beginning at or after ``i``."""
    i = _skip(s, i)
    _, end = _DECODER.raw_decode(s, i)
    return i, end


def _locate(s: str, field: FieldPath) -> tuple[int, int] | None:
    """The raw span of the value at ``field`` in the JSON text ``s``, None where absent (the
    last of duplicate keys, as json.loads keeps it)."""
    start, end = _value_span(s, 0)
    for key in field:
        found = None
        if isinstance(key, str) and s[start] == "{":
            i = _skip(s, start + 1)
            while s[i] != "}":
                k0, k1 = _value_span(s, i)
                name = json.loads(s[k0:k1])
                i = _skip(s, k1)
                v0, v1 = _value_span(s, i + 1)  # past the ":"
                if name == key:
                    found = (v0, v1)
                i = _skip(s, v1)
                if s[i] == ",":
                    i = _skip(s, i + 1)
        elif isinstance(key, int) and s[start] == "[":
            i, n = _skip(s, start + 1), 0
            while s[i] != "]":
                v0, v1 = _value_span(s, i)
                if n == key:
                    found = (v0, v1)
                i, n = _skip(s, v1), n + 1
                if s[i] == ",":
                    i = _skip(s, i + 1)
        if found is None:
            return None
        start, end = found
    return start, end


def _json_chars(literal: str) -> list[int]:
    """Where each character of a JSON string literal's value starts in the literal, then where the
    closing quote is (an escape is one character; a surrogate pair of escapes is one)."""
    starts, i = [], 1
    while literal[i] != '"':
        starts.append(i)
        if literal[i] == "\\":
            if literal[i + 1] == "u":
                code = int(literal[i + 2: i + 6], 16)
                pair = 0xD800 <= code < 0xDC00 and literal[i + 6: i + 8] == "\\u"
                i += 12 if pair else 6
            else:
                i += 2
        else:
            i += 1
    return starts + [i]


def _walk(node: Any, keys: FieldPath) -> Any:
    """The value at ``keys`` below ``node`` (dict keys and list indices), None where the path ends."""
    for key in keys:
        if isinstance(key, str) and isinstance(node, dict):
            node = node.get(key)
        elif isinstance(key, int) and isinstance(node, list) and -len(node) <= key < len(node):
            node = node[key]
        else:
            return None
    return node


class _JsonLine(_LineRecord):
    def __init__(self, raw: bytes, bom: bytes = b"") -> None:
        super().__init__(raw, bom)
        self.obj = json.loads(self.body) if self.body.strip() else None

    def value(self, field: FieldPath) -> Any:
        return _walk(self.obj, field)

    def edited(self, edits: list[FieldEdit]) -> bytes:
        text = self.body
        by_field: dict[FieldPath, list[FieldEdit]] = {}
        for e in edits:
            by_field.setdefault(e.path, []).append(e)
        located = []
        for field, group in by_field.items():
            value = self.value(field)
            if not isinstance(value, str):
                raise ValueError(f"the value at {_shown(field)} is not a string; it cannot be edited")
            span = _locate(text, field)
            assert span is not None  # value() found it
            located.append((span, value, group))
        for (a, b), value, group in sorted(located, key=lambda t: t[0][0], reverse=True):
            literal = text[a:b]
            starts = _json_chars(literal)
            ascii_only = literal.isascii()  # a file that escapes non-ASCII keeps doing so
            for s, t, new in _spliced(value, group):
                literal = (literal[: starts[s]] + json.dumps(new, ensure_ascii=ascii_only)[1:-1]
                           + literal[starts[t]:])
            text = text[:a] + literal + text[b:]
        return self.bom + text.encode("utf-8") + self.ending


class _JsonlDocument(_LinesDocument):
    record_type = _JsonLine


def _shown(field: FieldPath) -> str:
    return ".".join(str(k) for k in field) or "the line"


# ---------------------------------------------------------------------------------------------- CSV
@dataclass
class _CsvField:
    start: int  # raw characters of the field in the record's text
    end: int
    quoted: bool


def _csv_fields(text: str, pos: int) -> tuple[list[_CsvField], int, int]:
    """The fields of the record starting at ``pos`` (the excel dialect, strict), where its
    terminator starts, and where the next record starts."""
    fields, n = [], len(text)
    while True:
        start = pos
        if pos < n and text[pos] == '"':
            pos += 1
            while True:
                q = text.find('"', pos)
                if q < 0:
                    raise ValueError("unexpected end of data inside a quoted field")
                if text[q + 1: q + 2] == '"':
                    pos = q + 2
                    continue
                pos = q + 1
                break
            if pos < n and text[pos] not in ",\r\n":
                raise ValueError("',' expected after '\"'")
            fields.append(_CsvField(start, pos, True))
        else:
            while pos < n and text[pos] not in ",\r\n":
                pos += 1
            fields.append(_CsvField(start, pos, False))
        if pos < n and text[pos] == ",":
            pos += 1
            continue
        end = pos
        if text.startswith("\r\n", pos):
            pos += 2
        elif pos < n:
            pos += 1
        return fields, end, pos


def _csv_value(raw: str, quoted: bool) -> str:
    return raw[1:-1].replace('""', '"') if quoted else raw


class _CsvRecord(_Record):
    def __init__(self, doc: _CsvDocument, start: int, end: int, next_start: int,
                 fields: list[_CsvField]) -> None:
        self.doc, self.start, self.end, self.next_start, self.fields = doc, start, end, next_start, fields

    def cells(self) -> list[str]:
        return [_csv_value(self.doc.text[f.start:f.end], f.quoted) for f in self.fields]

    def value(self, field: FieldPath) -> Any:
        if len(field) != 1 or field[0] not in self.doc.columns:
            return None
        i = self.doc.columns.index(field[0])
        return self.cells()[i] if i < len(self.fields) else None

    def edited(self, edits: list[FieldEdit]) -> str:
        text = self.doc.text[self.start:self.next_start]
        by_index: dict[int, list[FieldEdit]] = {}
        for e in edits:
            if len(e.path) != 1 or e.path[0] not in self.doc.columns:
                raise ValueError(f"no column {_shown(e.path)!r}")
            by_index.setdefault(self.doc.columns.index(e.path[0]), []).append(e)
        for i in sorted(by_index, reverse=True):
            f = self.fields[i]
            a, b = f.start - self.start, f.end - self.start
            text = text[:a] + _csv_edited(text[a:b], f.quoted, by_index[i]) + text[b:]
        return text


def _csv_edited(raw: str, quoted: bool, edits: list[FieldEdit]) -> str:
    """A CSV field's raw text with the spans of its value replaced, its quoting kept (a value that
    now needs quotes gets them)."""
    value = _csv_value(raw, quoted)
    if not quoted:
        for a, b, new in _spliced(value, edits):
            value = value[:a] + new + value[b:]
        return value if not any(c in value for c in ',"\r\n') else '"' + value.replace('"', '""') + '"'
    starts, i = [], 1  # each character's place in the quoted field ('""' is one)
    while i < len(raw) - 1:
        starts.append(i)
        i += 2 if raw[i] == '"' else 1
    starts.append(len(raw) - 1)
    for a, b, new in _spliced(value, edits):
        raw = raw[: starts[a]] + new.replace('"', '""') + raw[starts[b]:]
    return raw


class _CsvDocument(_Document):
    def __init__(self, path: Path, raw: bytes) -> None:
        self.path = path
        self.bom = codecs.BOM_UTF8 if raw.startswith(codecs.BOM_UTF8) else b""
        try:
            self.text = raw[len(self.bom):].decode("utf-8")
            rows, pos = [], 0
            while pos < len(self.text):
                fields, end, nxt = _csv_fields(self.text, pos)
                rows.append(_CsvRecord(self, pos, end, nxt, fields))
                pos = nxt
        except (UnicodeDecodeError, ValueError) as e:
            raise DatasetError(str(path), f"cannot read it again to rewrite it ({e})") from e
        self._check(rows)
        blank = [not "".join(r.cells()).strip() and len(r.fields) <= 1 for r in rows]
        first = next((i for i, b in enumerate(blank) if not b), None)
        if first is None:
            raise DatasetError(str(path), "no header or rows")
        self.head_end = rows[first].next_start
        self.columns = rows[first].cells()
        self.records: list[_Record] = rows[first + 1:]

    def _check(self, rows: list[_CsvRecord]) -> None:
        """The fields found here are the csv module's (the loader's reader), record for record."""
        theirs = [r for r in csv.reader(io.StringIO(self.text, newline=""), strict=True)]
        ours = [r.cells() for r in rows]
        same = len(theirs) == len(ours) and all(a == b or (not a and b == [""]) for a, b in zip(theirs, ours,
                                                                                           strict=True))
        if not same:
            raise DatasetError(str(self.path), "its records could not be located exactly for rewriting "
                                               "(an unusual CSV dialect)")

    def write(self, target: Path, edits: dict[int, list[FieldEdit]], drop: set[int]) -> None:
        out = [self.text[: self.head_end],
               *self._kept(edits, drop, lambda _, record: self.text[record.start:record.next_start])]
        Path(target).write_bytes(self.bom + "".join(out).encode("utf-8"))


# ------------------------------------------------------------------------------------------ Parquet
class _ParquetRow(_Record):
    def __init__(self, doc: _ParquetDocument, index: int) -> None:
        self.doc, self.index = doc, index

    def value(self, field: FieldPath) -> Any:
        if not field or field[0] not in self.doc.table.column_names:
            return None
        return _walk(self.doc.column(str(field[0]))[self.index], field[1:])


class _ParquetDocument(_Document):
    def __init__(self, path: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.path = path
        try:
            with pq.ParquetFile(path) as pf:
                self.table = pf.read()
                meta = pf.metadata
                self.compression = (meta.row_group(0).column(0).compression.lower()
                                    if meta.num_row_groups and meta.num_columns else "snappy")
                self.row_group_size = meta.row_group(0).num_rows if meta.num_row_groups else None
        except (pa.ArrowException, OSError, ValueError) as e:
            raise DatasetError(str(path), f"not a readable parquet file ({e})") from e
        self._columns: dict[str, list[Any]] = {}
        self.records = [_ParquetRow(self, i) for i in range(self.table.num_rows)]

    def column(self, name: str) -> list[Any]:
        if name not in self._columns:
            self._columns[name] = self.table.column(name).to_pylist()
        return self._columns[name]

    def write(self, target: Path, edits: dict[int, list[FieldEdit]], drop: set[int]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = self.table
        by_column: dict[str, dict[int, list[FieldEdit]]] = {}
        for i, group in edits.items():
            for e in group:
                by_column.setdefault(str(e.path[0]) if e.path else "", {}).setdefault(i, []).append(e)
        for name, rows in by_column.items():
            if name not in table.column_names:
                raise DatasetError(str(self.path), f"no column {name!r} to edit")
            values = [_copy(v) for v in self.column(name)]
            for i, group in rows.items():
                for path, field_edits in _by_path(group).items():
                    try:
                        values[i] = _set(values[i], path[1:], field_edits)
                    except ValueError as e:
                        raise DatasetError(str(self.path), f"row {i + 1}: {e}") from e
            k = table.column_names.index(name)
            column = table.schema.field(k)
            table = table.set_column(k, column, pa.array(values, type=column.type))
        if drop:
            table = table.filter(pa.array([i not in drop for i in range(table.num_rows)]))
        table = table.replace_schema_metadata(self.table.schema.metadata)
        pq.write_table(table, target, compression=self.compression,
                       row_group_size=self.row_group_size or None)


def _copy(value: Any) -> Any:
    return copy.deepcopy(value) if isinstance(value, list | dict) else value


def _by_path(edits: list[FieldEdit]) -> dict[FieldPath, list[FieldEdit]]:
    out: dict[FieldPath, list[FieldEdit]] = {}
    for e in edits:
        out.setdefault(e.path, []).append(e)
    return out


def _set(node: Any, path: FieldPath, edits: list[FieldEdit]) -> Any:
    """``node`` with the string at ``path`` in it edited."""
    if not path:
        if not isinstance(node, str):
            raise ValueError("the value is not a string; it cannot be edited")
        for a, b, new in _spliced(node, edits):
            node = node[:a] + new + node[b:]
        return node
    key = path[0]
    if isinstance(key, str) and isinstance(node, dict) and key in node:
        node[key] = _set(node[key], path[1:], edits)
        return node
    if isinstance(key, int) and isinstance(node, list) and -len(node) <= key < len(node):
        node[key] = _set(node[key], path[1:], edits)
        return node
    raise ValueError(f"no value at {_shown(path)}")
