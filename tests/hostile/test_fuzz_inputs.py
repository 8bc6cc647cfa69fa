"""Property-based fuzzing of every file GNQ reads from a user: dataset files, config.json,
safetensors headers and tokenizer files.

Every generated case must end in a correct read or ONE line naming the file, never a traceback
(any other exception fails the test) and never a hang (each case has a time limit).  About 3,500
cases in total, small ones, so the file runs in well under half a minute.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import signal
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnq_core.sources.checkpoints.checks import check_checkpoint
from gnq_core.sources.checkpoints.errors import CheckpointError
from gnq_core.sources.checkpoints.tokenizer import load_tokenizer
from gnq_core.sources.datasets import DatasetError, TextDataset, load_texts

sys.path.insert(0, str(Path(__file__).parent))
from hostile_helpers import make_series  # noqa: E402

CASE_SECONDS = 10  # a case still running after this is a hang
_SUPPRESS = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]


def fuzz(cases: int) -> settings:
    # No deadline: time_limit catches hangs; a loaded machine must not make timing flaky.
    return settings(max_examples=cases, deadline=None, suppress_health_check=_SUPPRESS)


@contextlib.contextmanager
def time_limit(seconds: float = CASE_SECONDS) -> Iterator[None]:
    def hang(signum, frame):  # noqa: ARG001
        raise AssertionError(f"no answer after {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def one_line_naming(exc: BaseException, name: str) -> None:
    message = str(exc)
    assert message and "\n" not in message and "\r" not in message, repr(message)
    assert name in message, message
    assert "Traceback" not in message


def read_dataset(path: Path) -> TextDataset | None:
    """load_texts, where a DatasetError must be one line naming the file."""
    with time_limit():
        try:
            return load_texts(path)
        except DatasetError as exc:
            one_line_naming(exc, path.name)
            return None


# ------------------------------------------------------------------------------------------ datasets

# Pieces that matter to the parsers: separators, quotes, line ends, JSON syntax, BOM, NUL, non-ASCII.
PIECES = st.sampled_from([",", '"', "'", "\n", "\r", "\r\n", "{", "}", "[", "]", ":", "\\", "text", "group",
                          '"text"', "\ufeff", "\x00", " ", "\t", "é", "\u202e", "null", "1", "=1+1"])
NOISE = st.one_of(st.binary(max_size=200),
                  st.lists(st.one_of(PIECES, st.text(max_size=5)), max_size=40).map("".join)
                  .map(lambda s: s.encode("utf-8", "surrogatepass")))
CELL = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)


@fuzz(600)
@given(suffix=st.sampled_from([".txt", ".jsonl", ".csv", ".parquet"]), body=NOISE)
def test_dataset_noise_is_read_or_refused_in_one_line(tmp_path: Path, suffix: str, body: bytes) -> None:
    path = tmp_path / f"noise{suffix}"
    path.write_bytes(body)
    dataset = read_dataset(path)
    if dataset is not None:
        assert dataset.texts and all(isinstance(t, str) and t.strip() for t in dataset.texts)
        assert len(dataset.groups) == len(dataset.texts)


@fuzz(700)
@given(header=st.lists(st.sampled_from(["text", "group", "id", "x", ""]), min_size=1, max_size=3),
       rows=st.lists(st.lists(CELL, min_size=0, max_size=4), max_size=6),
       quoting=st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL]))
def test_csv_reads_exactly_what_was_written_or_names_the_line(tmp_path: Path, header: list[str],
                                                                rows: list[list[str]], quoting: int) -> None:
    buffer = io.StringIO(newline="")
    csv.writer(buffer, quoting=quoting).writerows([header, *rows])
    path = tmp_path / "data.csv"
    path.write_bytes(buffer.getvalue().encode("utf-8"))
    dataset = read_dataset(path)
    blank = [len(r) <= 1 and not "".join(r).strip() for r in rows]
    ragged = [not b and len(r) != len(header) for r, b in zip(rows, blank, strict=True)]
    header_ok = len(set(header)) == len(header) and not (len(header) == 1 and not header[0].strip())
    if dataset is None:
        return  # refused: the message was checked above
    # A read is only allowed when it is exact: no ragged row was guessed at, every text kept as written.
    assert header_ok and not any(ragged)
    expected = [r[header.index("text")] for r, b in zip(rows, blank, strict=True) if not b]
    assert dataset.texts == [t for t in expected if t.strip()]


def test_csv_refusal_names_the_first_ragged_line(tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_text('text,group\n"a\nb",1\nc,2\nd\n', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"data\.csv:5: 1 field, header has 2"):
        load_texts(path)


JSON_VALUE = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=True)
                          | CELL, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(CELL, inner, max_size=3), max_leaves=8)


@fuzz(500)
@given(records=st.lists(st.one_of(st.dictionaries(st.sampled_from(["text", "group", "x"]), JSON_VALUE,
                                                  max_size=3), JSON_VALUE), max_size=6))
def test_jsonl_reads_exactly_or_refuses(tmp_path: Path, records: list) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    dataset = read_dataset(path)
    if dataset is None:
        return
    assert all(isinstance(r, dict) for r in records)
    expected = [r.get("text") for r in records]
    expected = [t if isinstance(t, str) else str(t) for t in expected
                if t is not None and not (isinstance(t, float) and t != t) and str(t).strip()]
    assert dataset.texts == expected


# --------------------------------------------------------------------------------------- checkpoints


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_series(tmp_path_factory.mktemp("fuzz-ckpt"), 1) / "epoch-1"


@contextlib.contextmanager
def replaced(folder: Path, name: str, body: bytes) -> Iterator[Path]:
    """``folder/name`` holding ``body`` for the duration of the block, restored afterwards."""
    original = (folder / name).read_bytes()
    (folder / name).write_bytes(body)
    try:
        yield folder / name
    finally:
        (folder / name).write_bytes(original)


def check_or_refuse(folder: Path) -> None:
    with time_limit():
        try:
            check_checkpoint(folder)
        except CheckpointError as exc:
            one_line_naming(exc, folder.name)


CONFIG_KEYS = ["model_type", "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner",
               "architectures", "activation_function", "layer_norm_epsilon", "is_encoder_decoder",
               "tie_word_embeddings", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "torch_dtype", "auto_map", "bos_token_id", "eos_token_id"]
SMALL_JSON = st.one_of(st.none(), st.booleans(), st.integers(-3, 72), st.floats(-2, 100),
                       st.just(float("nan")),
                       st.sampled_from(["gpt2", "llama", "bert", "t5", "GPT2LMHeadModel", "gelu", "",
                                        "float16", "x.y"]),
                       st.lists(st.sampled_from(["GPT2LMHeadModel", "BertModel", "x"]), max_size=2),
                       st.dictionaries(st.sampled_from(["AutoModel", "a"]), st.just("m.C"), max_size=1))


@fuzz(200)
@given(edits=st.dictionaries(st.sampled_from(CONFIG_KEYS), SMALL_JSON, max_size=4),
       drop=st.lists(st.sampled_from(CONFIG_KEYS), max_size=2), raw=st.none() | NOISE)
def test_config_json_is_loaded_or_refused_in_one_line(checkpoint: Path, edits: dict, drop: list,
                                                      raw: bytes | None) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    config.update(edits)
    for key in drop:
        config.pop(key, None)
    body = raw if raw is not None else json.dumps(config).encode()
    with replaced(checkpoint, "config.json", body):
        check_or_refuse(checkpoint)


DTYPES = st.sampled_from(["F32", "F16", "BF16", "I64", "U8", "BOOL", "F64", "X9", ""])
TENSOR = st.fixed_dictionaries({"dtype": DTYPES, "shape": st.lists(st.integers(-1, 9), max_size=3),
                                "data_offsets": st.lists(st.integers(-1, 300), min_size=0, max_size=3)})
HEADER = st.dictionaries(st.sampled_from(["transformer.wte.weight", "lm_head.weight", "__metadata__", "x"]),
                         st.one_of(TENSOR, JSON_VALUE), max_size=3)


@fuzz(400)
@given(header=st.one_of(HEADER.map(lambda h: json.dumps(h).encode()), st.binary(max_size=60)),
       declared=st.one_of(st.none(), st.integers(0, 2**64 - 1)), data=st.binary(max_size=300))
def test_safetensors_header_is_read_or_refused_in_one_line(checkpoint: Path, header: bytes,
                                                           declared: int | None, data: bytes) -> None:
    length = len(header) if declared is None else declared
    with replaced(checkpoint, "model.safetensors", struct.pack("<Q", length) + header + data):
        check_or_refuse(checkpoint)


def mutate(value, path: list, replacement):
    """``value`` with the node at ``path`` (indices into dict items / list items) replaced."""
    if not path or not isinstance(value, dict | list) or not value:
        return replacement
    index = path[0] % len(value)
    if isinstance(value, dict):
        key = list(value)[index]
        return {**value, key: mutate(value[key], path[1:], replacement)}
    return [*value[:index], mutate(value[index], path[1:], replacement), *value[index + 1:]]


@fuzz(250)
@given(name=st.sampled_from(["tokenizer.json", "tokenizer_config.json"]),
       path=st.lists(st.integers(0, 400), max_size=4), replacement=JSON_VALUE, raw=st.none() | NOISE)
def test_tokenizer_files_are_loaded_or_refused_in_one_line(checkpoint: Path, name: str, path: list,
                                                           replacement, raw: bytes | None) -> None:
    body = raw if raw is not None else json.dumps(
        mutate(json.loads((checkpoint / name).read_text()), path, replacement)).encode()
    with replaced(checkpoint, name, body), time_limit():
        try:
            load_tokenizer(checkpoint)  # the config's limits, then the tokenizer
        except CheckpointError as exc:
            one_line_naming(exc, checkpoint.name)
