"""Every value validated before anything is written, against the range of the
store column that will hold it too: one line naming the option, exit code 1, no store, no run."""

from __future__ import annotations

import numpy as np
import pytest
from hostile_helpers import write_texts_csv
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.pipelines.settings import AuditSettings, TrainSettings


def refused(*args: object) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output and "Usage" not in result.output
    return lines[0]


@pytest.mark.parametrize(("option", "value"), [
    ("--seed", -1), ("--seed", 2**31), ("--batch-size", 2**31), ("--epochs", 2**40), ("--lr", "inf"),
    ("--lr", "nan"), ("--vocab-size", 10**9), ("--max-length", 2**31)])
def test_train_refuses_out_of_range_values_before_writing(tmp_path, option, value):
    data = write_texts_csv(tmp_path / "texts.csv", 8)
    db = tmp_path / "gnq.duckdb"
    line = refused("train", "--from-scratch", "--data", data, "--out", tmp_path / "out", "--db", db,
                   option, value)
    assert option in line
    assert not db.exists() and not (tmp_path / "out").exists()


def test_audit_refuses_a_negative_seed(tmp_path):
    data = write_texts_csv(tmp_path / "texts.csv", 8)
    line = refused("audit", "--checkpoints", tmp_path, "--data", data, "--db", tmp_path / "gnq.duckdb",
                   "--seed", -1)
    assert "--seed" in line and not (tmp_path / "gnq.duckdb").exists()


@pytest.mark.parametrize("args", [["export", "--run", "x", "--out", "x.csv", "--top", -5],
                                  ["dashboard", "--port", 0], ["report", "--run", "x", "--out", "r.html",
                                                               "--top", 0]])
def test_an_option_below_its_minimum_is_one_line_exit_1(args):
    assert "Invalid value for '--" in refused(*args)


def test_numpy_integers_are_whole_numbers():
    assert AuditSettings(seed=np.int64(3), batch_size=np.int32(4)).seed == 3
    with pytest.raises(ValueError, match="--seed"):
        AuditSettings(seed=1.5)
    with pytest.raises(ValueError, match="--lr"):
        TrainSettings(lr=float("inf"))


@pytest.mark.parametrize("ref", ["²", "٣", "1²"])
def test_a_run_named_by_a_unicode_digit_is_not_found_not_a_traceback(tmp_path, ref):
    from gnq_core.results.store import Store
    from gnq_core.results.store_schema import RunNotFoundError

    store = Store(tmp_path / "gnq.duckdb")
    store._ensure_schema()
    with pytest.raises(RunNotFoundError):
        store.run(ref)


@pytest.mark.parametrize("table", ["extractions", "runs"])
def test_a_store_missing_a_table_is_one_line(tmp_path, table):
    import duckdb

    from gnq_core.results.store import Store

    db = tmp_path / "gnq.duckdb"
    Store(db)._ensure_schema()
    con = duckdb.connect(str(db))
    con.execute(f"DROP TABLE {table}")
    con.close()
    line = refused("runs", "--db", db)
    assert str(db) in line.replace("\n", "")


@pytest.mark.parametrize("cut", [4096, 262_144])
def test_a_truncated_store_is_one_line_for_readers_and_writers(tmp_path, cut):
    """Writing to a truncated store gave a DuckDB traceback."""
    from gnq_core.results.store import Store
    from gnq_core.results.store_schema import StoreError

    db = tmp_path / "gnq.duckdb"
    Store(db)._ensure_schema()
    with open(db, "r+b") as f:
        f.truncate(cut)
    assert str(db) in refused("runs", "--db", db).replace("\n", "")
    with pytest.raises(StoreError, match="gnq.duckdb: cannot open the store"):
        Store(db)._ensure_schema()


def _panicking_pre_tokenizer():
    """A backtracking pre-tokenizer regex: Rust's regex engine gives up on "aaaa…b" and panics."""
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Split(Regex("(a|a)+$"), "isolated")


def test_a_tokenizer_that_panics_is_one_line_naming_its_folder(tmp_path, capfd):
    """A backtracking pre-tokenizer regex in an untrusted tokenizer.json panics the Rust tokenizer
    (pyo3's PanicException, a BaseException): refused as a ValueError naming the folder, and
    nothing of Rust's own panic note ("thread ... panicked at") reaches file descriptor 2."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from gnq_core.sources.tokenizer_panics import TokenizerFailure
    from gnq_core.sources.tokens import encode_texts

    raw = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    raw.pre_tokenizer = _panicking_pre_tokenizer()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, name_or_path=str(tmp_path / "ckpt"))
    capfd.readouterr()
    with pytest.raises(TokenizerFailure, match="ckpt: the tokenizer failed"):
        encode_texts(tok, ["a" * 5000 + "b"], 16)
    assert capfd.readouterr().err == ""
    assert encode_texts(tok, ["a"], 16) == [[0]]  # fd 2 restored, the tokenizer still usable


def test_what_a_tokenizer_writes_to_stderr_without_panicking_is_kept(capfd):
    import os

    from gnq_core.sources.tokenizer_panics import panics_as_one_line

    with panics_as_one_line("here", "failed"):
        os.write(2, b"a warning\n")
    assert capfd.readouterr().err == "a warning\n"


def test_an_audit_over_a_panicking_tokenizer_prints_one_line(tmp_path, capfd):
    """The same panic met by `gnq audit` (the texts are tokenised after the checkpoints were checked):
    stderr holds our one line and nothing else."""
    import json

    from hostile_helpers import make_series

    from gnq_core.sources.checkpoints.tokenizer import load_tokenizer
    from gnq_core.sources.tokens import char_bound

    series = make_series(tmp_path / "ckpts", 1, max_length=256)
    # within what --max-length 256 reads of a text (texts are cut to char_bound before tokenising)
    assert char_bound(load_tokenizer(series / "epoch-1"), 256) > 5001
    spec = json.loads((series / "epoch-1" / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = json.loads(_panicking_pre_tokenizer().__getstate__())
    (series / "epoch-1" / "tokenizer.json").write_text(json.dumps(spec))
    data = tmp_path / "texts.csv"
    data.write_text("text\n" + "a" * 5000 + "b\nhello there\n")
    capfd.readouterr()
    line = refused("audit", "--checkpoints", series, "--data", data, "--db", tmp_path / "gnq.duckdb",
                   "--max-length", 256, "-q")
    assert "epoch-1: the tokenizer failed on the texts" in line
    assert capfd.readouterr().err == ""  # nothing written past Python (Rust's panic note)


def test_whitespace_only_csv_rows_are_counted_as_dropped(tmp_path):
    from gnq_core.sources.datasets import load_texts

    data = tmp_path / "texts.csv"
    data.write_text("text\nfirst text\n   \n\t\nsecond text\n\n", encoding="utf-8")
    dataset = load_texts(data)
    assert dataset.texts == ["first text", "second text"] and dataset.dropped == 2


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_nested_texts_are_refused_not_audited_as_their_repr(tmp_path, suffix):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from gnq_core.sources.datasets import DatasetError, load_texts

    data = tmp_path / f"texts{suffix}"
    if suffix == ".parquet":
        pq.write_table(pa.table({"text": [["a", "b"], ["c"]]}), data)
    else:
        data.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"text": {"k": "v"}}) + "\n")
    with pytest.raises(DatasetError, match="not a text"):
        load_texts(data)


class _Payload:
    def __reduce__(self):
        return (print, ("pwned",))


def test_the_pickle_refusal_is_not_preceded_by_a_torch_warning(tmp_path):
    import pickle
    import warnings

    from gnq_core.sources.checkpoints.errors import CheckpointError
    from gnq_core.sources.checkpoints.formats import load_pickled_weights

    weights = tmp_path / "pytorch_model.bin"
    weights.write_bytes(pickle.dumps({"w": _Payload()}, protocol=4))  # not torch's protocol 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(CheckpointError, match="refusing to unpickle"):
            load_pickled_weights([weights])
    assert not [w for w in caught if issubclass(w.category, UserWarning)], [str(w.message) for w in caught]


def test_an_upload_name_2000_folders_deep_is_one_line():
    from gnq_core.jobs.uploads import safe_relative_path

    with pytest.raises(ValueError, match="2000 folders deep"):
        safe_relative_path("a/" * 2000 + "texts.csv")
    assert str(safe_relative_path("run/epoch-1/config.json")) == "run/epoch-1/config.json"


def test_texts_without_words_are_not_copies_of_each_other():
    from gnq_core.sources.copies import find_copies

    frame = find_copies(["!!!", "???", "...", "—", "a real text here", "!!!"])
    assert frame["copies"].tolist() == [2, 1, 1, 1, 1, 2]  # only the equal "!!!" pair
