"""One preflight for every door: ``gnq estimate`` skipped the checks ``audit`` and ``extract``
make (a candidate count past extract's bound never returned; batch sizes, lengths beyond the
model's positions and node budgets got estimates; a bad integer's message did not name its
option) and had no --base-model.  Now every door validates through pipelines/preflight.py: the
same refusals, the same one line naming the option."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
import torch
from lm_fixtures import texts, tiny_gpt2, tiny_llama, tokenizer
from transformers import PreTrainedTokenizerFast
from typer.testing import CliRunner

from gnq_core.cli import app

peft = pytest.importorskip("peft")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("preflight")
    torch.manual_seed(0)
    tiny_gpt2().to(torch.float32).save_pretrained(root / "model")  # 64 positions
    tok = PreTrainedTokenizerFast(tokenizer_object=tokenizer(), pad_token="<pad>", unk_token="<unk>")
    tok.save_pretrained(root / "model")
    pd.DataFrame({"text": list(texts(6))}).to_csv(root / "texts.csv", index=False)
    return root


def refused(*args) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


AUDIT_AND_ESTIMATE = [(["--batch-size", 1], "--batch-size must be"),
                      (["--batch-size", 10**23], "--batch-size must be"),
                      (["--max-length", 100_000], "--max-length 100000 is more than the 64 positions"),
                      (["--seed", -1], "--seed must be"),
                      (["--companions", 0], "--companions"),
                      (["--lam", 0], "--lam"),
                      (["--dtype", "float8"], "--dtype"),
                      (["--secret-pattern", "a{4294967296}"], "--secret-pattern"),
                      (["--merge-adapter"], "--base-model")]


@pytest.mark.parametrize("extra,message", AUDIT_AND_ESTIMATE)
def test_estimate_refuses_what_audit_refuses_with_the_same_line(inputs, tmp_path, extra, message):
    common = ["--checkpoints", inputs / "model", "--data", inputs / "texts.csv", *extra]
    said = refused("audit", *common, "--db", tmp_path / "gnq.duckdb", "--quiet")
    assert message in said
    assert refused("estimate", *common) == said
    assert not (tmp_path / "gnq.duckdb").exists()  # refused before the store is made


EXTRACT_AND_ESTIMATE = [(["--secret-candidates", 10**9], "--secret-candidates must be"),
                        (["--secret-candidates", 5], "--secret-candidates must be 1"),
                        (["--exposure-nodes", 0], "--exposure-nodes must be"),
                        (["--prefix-tokens", 0], "--prefix-tokens must be"),
                        (["--threshold", 2], "--threshold"),
                        (["--preset", "1/1"], "--preset")]


@pytest.mark.parametrize("extra,message", EXTRACT_AND_ESTIMATE)
def test_estimate_refuses_what_extract_refuses_with_the_same_line(inputs, tmp_path, extra, message):
    said = refused("extract", "--run", "r", "--db", tmp_path / "gnq.duckdb", *extra)
    assert message in said
    common = ["--checkpoints", inputs / "model", "--data", inputs / "texts.csv"]
    assert refused("estimate", *common, *extra) == said


def test_a_bad_integer_names_its_option(inputs):
    line = refused("estimate", "--checkpoints", inputs / "model", "--data", inputs / "texts.csv",
                   "--attack-batch-size", "many")
    assert "--attack-batch-size" in line


def test_estimate_takes_every_option_audit_takes():
    import typer.main

    command = typer.main.get_command(app)
    options = {name: {o for p in command.commands[name].params for o in p.opts}  # type: ignore[attr-defined]
               for name in ("audit", "estimate")}
    assert options["audit"] - {"--db", "--quiet", "-q"} <= options["estimate"]


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated")  # PEFT's save, in this test
def test_estimate_times_an_adapter_series_with_its_base(tmp_path):
    torch.manual_seed(0)
    base = tiny_llama().to(torch.float32)
    tok = PreTrainedTokenizerFast(tokenizer_object=tokenizer(), pad_token="<pad>", unk_token="<unk>")
    base.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                             init_lora_weights=False)
    peft.get_peft_model(copy.deepcopy(base), config).save_pretrained(tmp_path / "run" / "checkpoint-1")
    pd.DataFrame({"text": list(texts(6))}).to_csv(tmp_path / "texts.csv", index=False)
    result = CliRunner().invoke(app, [str(a) for a in (
        "estimate", "--checkpoints", tmp_path / "run", "--data", tmp_path / "texts.csv", "--base-model",
        tmp_path / "base", "--batch-size", 2, "--max-length", 16, "--no-attack", "--threads", 1)],
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "gradient audit" in result.output and "6 texts" in result.output
    # the adapter's own bound: beyond the base's positions is refused as for gnq audit
    line = refused("estimate", "--checkpoints", tmp_path / "run", "--data", tmp_path / "texts.csv",
                   "--base-model", tmp_path / "base", "--max-length", 100_000)
    assert "--max-length 100000 is more than the 64 positions" in line
