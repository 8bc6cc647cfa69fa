"""A JSONL object with a key twice was read with its last value, without a word (CSV and Parquet
refuse a duplicate column since round four): refused in one line naming the file, line and key."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.sources.datasets import DatasetError, dataset_columns, load_texts


@pytest.mark.parametrize("line,key", [('{"text": "a private note", "text": "a public one"}', "text"),
                                      ('{"text": "ok", "group": "a", "group": "b"}', "group"),
                                      ('{"text": "ok", "meta": {"id": 1, "id": 2}}', "id")])
def test_a_key_given_twice_is_refused_naming_file_line_and_key(tmp_path, line, key):
    path = tmp_path / "texts.jsonl"
    path.write_text('{"text": "first"}\n\n' + line + "\n", encoding="utf-8")
    for read in (load_texts, dataset_columns):
        with pytest.raises(DatasetError) as caught:
            read(path)
        message = str(caught.value)
        assert message.startswith(f"{path}: line 3: the key {key!r} is given twice"), message
        assert "\n" not in message


def test_gnq_audit_says_it_in_one_line(tmp_path):
    path = tmp_path / "texts.jsonl"
    path.write_text('{"text": "a", "text": "b"}\n', encoding="utf-8")
    result = CliRunner().invoke(app, ["audit", "--checkpoints", str(tmp_path), "--data", str(path),
                                      "--db", str(tmp_path / "gnq.duckdb")], catch_exceptions=False)
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert "line 1: the key 'text' is given twice" in lines[0]


def test_the_same_key_in_different_objects_is_fine(tmp_path):
    path = tmp_path / "texts.jsonl"
    path.write_text('{"text": "a", "meta": {"text": "x"}}\n{"text": "b"}\n', encoding="utf-8")
    assert load_texts(path).texts == ["a", "b"]
