"""A refusal is one line: transformers' own warnings made while a refused
checkpoint was checked are dropped (kept when it passes); a rotary scaling factor of -2 or an
out-of-range yarn field is refused with the rule, not "division by zero"; a text is cut to a character
bound from --max-length before it is tokenised, so a 2-million-character word costs no more than a
short text, with the same token ids."""

from __future__ import annotations

import json
import logging
import time

import pytest
from hostile_helpers import gnq_fails
from lm_fixtures import texts
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.sources.checkpoints.checks import check_checkpoint
from gnq_core.sources.checkpoints.errors import CheckpointError


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny Llama checkpoint (rotary embeddings) with 64 positions."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from gnq_core.sources.checkpoints.save import save_checkpoint
    from gnq_core.sources.models import train_tokenizer

    folder = tmp_path_factory.mktemp("llama") / "ckpt"
    tokenizer = train_tokenizer(texts(50), vocab_size=300)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    save_checkpoint(LlamaForCausalLM(config), tokenizer, folder)
    return folder


def _with_rope(folder, rope: dict) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {"rope_theta": 10000.0} | rope
    (folder / "config.json").write_text(json.dumps(config))


def test_transformers_warnings_are_dropped_from_a_refusal(llama, tmp_path):
    """The real stderr of `gnq audit`: transformers warns about the key while building the config,
    then the checkpoint is refused (too few positions): one line."""
    _with_rope(llama, {"rope_type": "yarn", "factor": 2.0, "odd_key_for_the_test": 1})
    data = tmp_path / "texts.txt"
    data.write_text("hello there\nanother text\n")
    line = gnq_fails("audit", "--checkpoints", llama, "--data", data, "--db", tmp_path / "g.duckdb",
                     "--max-length", 128, "--quiet")
    assert "--max-length 128 is more than the 64 positions" in line


def test_transformers_warnings_are_kept_when_the_checkpoint_passes(llama, caplog):
    _with_rope(llama, {"rope_type": "yarn", "factor": 2.0, "other_odd_key": 1})
    with caplog.at_level(logging.WARNING):
        check_checkpoint(llama, max_length=16)
    assert any("other_odd_key" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING), pytest.raises(CheckpointError):
        check_checkpoint(llama, max_length=128)
    assert not any("other_odd_key" in r.getMessage() for r in caplog.records)


ROPE_CASES = [({"rope_type": "yarn", "factor": -2},
               "rope_parameters.factor is -2; rotary scaling needs a number of at least 1"),
              ({"rope_type": "yarn", "factor": 2.0, "beta_fast": 0},
               "rope_parameters.beta_fast is 0; rotary scaling needs a number above 0"),
              ({"rope_type": "linear", "factor": "2"}, 'rope_parameters.factor is "2"')]


@pytest.mark.parametrize(("rope", "said"), ROPE_CASES)
def test_an_out_of_range_rotary_scaling_is_one_line_with_the_rule(llama, tmp_path, rope, said):
    _with_rope(llama, rope)
    data = tmp_path / "texts.txt"
    data.write_text("hello there\nanother text\n")
    result = CliRunner().invoke(app, ["audit", "--checkpoints", str(llama), "--data", str(data), "--db",
                                      str(tmp_path / "g.duckdb"), "--max-length", "16", "--quiet"])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith(f"error: {llama / 'config.json'}: {said}")
    assert not (tmp_path / "g.duckdb").exists()


def test_a_long_word_is_cut_before_tokenising_with_the_same_ids():
    from gnq_core.sources.models import train_tokenizer
    from gnq_core.sources.tokens import _encode, char_bound, encode_texts

    tokenizer = train_tokenizer(texts(200), vocab_size=300)
    assert char_bound(tokenizer, 32) < 20_000
    word = "a" * 200_000
    mixed = ["short", "x " * 50_000, word, "b" + " " * 100_000 + "c", "é" * 30_000 + "z"]
    assert encode_texts(tokenizer, mixed, 32) == _encode(tokenizer, mixed, 32)  # as if read whole
    started = time.perf_counter()
    encode_texts(tokenizer, ["a" * 2_000_000], 512)  # whole, 1M characters took 3.3 s (2-core CPU)
    assert time.perf_counter() - started < 1.0
