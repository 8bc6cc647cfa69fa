"""Readers turn malformed columns, numbers and encodings into one line naming the file: a Parquet
file with two columns of one name, a JSON-escaped lone surrogate in a
.jsonl text or group, a 5,000-digit integer in any .jsonl field; a damaged older store fails its
migration in one line, left byte for byte as it was; a checkpoint's Rust tokenizer panicking while
decoding (not only encoding) is one line naming its folder, with nothing of Rust's note on fd 2."""

from __future__ import annotations

import hashlib
import json

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hostile_helpers import make_series

from gnq_core.results.store import Store
from gnq_core.results.store_schema import StoreError, apply_migrations
from gnq_core.sources.datasets import DatasetError, load_texts


def test_a_parquet_with_two_columns_of_one_name_is_one_line(tmp_path):
    data = tmp_path / "texts.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array(["a", "b"]), pa.array(["c", "d"])], names=["text", "text"]),
                   data)
    with pytest.raises(DatasetError, match=r"texts\.parquet: duplicate column names \(columns: text, text\)"):
        load_texts(data)


@pytest.mark.parametrize("field", ["text", "group"])
def test_a_lone_surrogate_in_a_jsonl_text_or_group_is_one_line(tmp_path, field):
    data = tmp_path / "texts.jsonl"
    row = {"text": "fine", "group": "g"} | {field: "bad \ud800 half"}
    data.write_text(json.dumps({"text": "ok", "group": "g"}) + "\n" + json.dumps(row) + "\n")
    assert "\\ud800" in data.read_text()  # escaped in the file, as an attacker writes it
    with pytest.raises(DatasetError) as info:
        load_texts(data)
    message = str(info.value)
    assert message.startswith(f"{data}: row 2: column '{field}' holds a lone surrogate (\\ud800)")
    message.encode("utf-8")  # printable: the surrogate itself is not in the message


def test_a_5000_digit_integer_in_any_jsonl_field_is_one_line_naming_the_file(tmp_path):
    data = tmp_path / "texts.jsonl"
    data.write_text(json.dumps({"text": "fine"}) + "\n" + '{"text": "x", "n": ' + "9" * 5000 + "}\n")
    with pytest.raises(DatasetError, match=rf"^{data}: line 2: unreadable JSON value \(Exceeds the limit"):
        load_texts(data)


def _schema7_store_without(tmp_path, table: str):
    db = tmp_path / "gnq.duckdb"
    con = duckdb.connect(str(db))
    apply_migrations(con, 0, 7)
    con.execute(f"DROP TABLE {table}")
    con.close()
    return db


def test_a_damaged_older_store_fails_its_migration_in_one_line_and_is_left_as_it_was(tmp_path):
    db = _schema7_store_without(tmp_path, "scores")
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    with pytest.raises(StoreError, match=r"gnq\.duckdb: a damaged store: schema 7 but no table scores"):
        Store(db)._ensure_schema()
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_a_migration_that_fails_half_way_leaves_the_store_as_it_was(tmp_path):
    """Every table there, but one a migration alters is not as it expects: all pending migrations
    are one transaction, so schema 6 stays schema 6 (not 7 with 8 failed)."""
    db = tmp_path / "gnq.duckdb"
    con = duckdb.connect(str(db))
    apply_migrations(con, 0, 6)
    con.execute("ALTER TABLE scores ADD COLUMN min_k DOUBLE")  # migration 8 adds it
    con.close()
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    refusal = r"gnq\.duckdb: cannot migrate this store to schema \d+ .*left as it was"
    with pytest.raises(StoreError, match=refusal):
        Store(db)._ensure_schema()
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] == 6
    con.close()


def test_the_cli_says_a_damaged_store_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from gnq_core.cli import app

    db = _schema7_store_without(tmp_path, "scores")
    result = CliRunner().invoke(app, ["demo", "--db", str(db), "--quiet"])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and "no table scores" in lines[0], result.output


@pytest.fixture(scope="module")
def decode_panics(tmp_path_factory):
    """A checkpoint whose tokenizer.json decoder runs a backtracking regex over the joined text."""
    from tokenizers import Regex, decoders

    series = make_series(tmp_path_factory.mktemp("decoder") / "series", 1)
    spec = json.loads((series / "epoch-1" / "tokenizer.json").read_text())
    spec["decoder"] = json.loads(decoders.Sequence([decoders.ByteLevel(), decoders.Fuse(),
                                                    decoders.Replace(Regex("(a|a)+$"), "x")]).__getstate__())
    (series / "epoch-1" / "tokenizer.json").write_text(json.dumps(spec))
    return series / "epoch-1"


def test_decoding_with_a_panicking_tokenizer_is_one_line_naming_its_folder(decode_panics, capfd):
    from gnq_core.sources.checkpoints.load import load_checkpoint
    from gnq_core.sources.tokenizer_panics import TokenizerFailure

    _, tokenizer = load_checkpoint(decode_panics)
    ids = tokenizer("hello there", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == "hello there"
    attack = [tokenizer.convert_tokens_to_ids("a")] * 3000 + [tokenizer.convert_tokens_to_ids("b")]
    capfd.readouterr()
    for decode in (tokenizer.decode, lambda x: tokenizer.batch_decode([x])):
        with pytest.raises(TokenizerFailure, match=f"{decode_panics}: the tokenizer failed while decoding"):
            decode(attack)
    assert capfd.readouterr().err == ""  # nothing of Rust's panic note
    assert tokenizer.decode(ids) == "hello there"  # still usable, fd 2 restored


def test_the_guarded_backend_is_still_the_tokenizer(decode_panics, tmp_path):
    import copy

    from tokenizers import Tokenizer

    from gnq_core.sources.checkpoints.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(decode_panics)
    assert isinstance(tokenizer.backend_tokenizer, Tokenizer)
    clone = copy.deepcopy(tokenizer)
    assert clone.decode(clone("hello", add_special_tokens=False)["input_ids"]) == "hello"
    tokenizer.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "tokenizer.json").read_text())
    assert saved == json.loads(tokenizer.backend_tokenizer.to_str())
