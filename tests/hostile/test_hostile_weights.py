"""Numerical failure is not silent: NaN/Inf in config.json or in the weights is
refused before a run starts; a run whose batches are mostly non-finite ends 'failed' with one line,
not 'done' with rc 0."""

from __future__ import annotations

import json

import pytest
from hostile_helpers import make_series, write_texts_csv
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.results.store import Store

pytestmark = pytest.mark.slow


def audit(series, data, db) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["audit", "--checkpoints", str(series), "--data", str(data), "--db",
                                      str(db), "--name", "r", "--batch-size", "4", "--max-length", "16",
                                      "--quiet"])
    return result.exit_code, result.output


def one_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    return lines[0]


@pytest.fixture
def series_and_data(tmp_path):
    return make_series(tmp_path / "series", 1, max_length=16), write_texts_csv(tmp_path / "texts.csv", 12)


@pytest.mark.parametrize(("quant", "said"), [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes, 4-bit"),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, "bitsandbytes, 8-bit"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "gptq, 4-bit"),
])
def test_a_quantised_checkpoint_is_refused_in_one_line_naming_why(tmp_path, series_and_data, quant, said):
    """Quantised weights have no exact gradient: refused before loading, with what they are."""
    series, data = series_and_data
    config = series / "epoch-1" / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"quantization_config": quant}))
    code, output = audit(series, data, tmp_path / "gnq.duckdb")
    line = one_line(output)
    assert code == 1 and f"a quantised model ({said})" in line and "config.json" in line
    assert not (tmp_path / "gnq.duckdb").exists()


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_nonfinite_config_value_is_refused_before_the_run(tmp_path, series_and_data, value):
    series, data = series_and_data
    config = series / "epoch-1" / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"layer_norm_epsilon": value}))
    code, output = audit(series, data, tmp_path / "gnq.duckdb")
    assert code == 1 and "layer_norm_epsilon" in one_line(output)
    assert not (tmp_path / "gnq.duckdb").exists()


def _poison(series) -> None:
    weights = series / "epoch-1" / "model.safetensors"
    tensors = load_file(weights)
    for name, tensor in tensors.items():
        if "wte" in name:  # the input embedding: every text's loss is NaN
            tensor.fill_(float("nan"))
    save_file(tensors, weights, metadata={"format": "pt"})


def test_nonfinite_weights_are_refused_before_the_run(tmp_path, series_and_data):
    series, data = series_and_data
    _poison(series)
    code, output = audit(series, data, tmp_path / "gnq.duckdb")
    assert code == 1 and "wte" in one_line(output) and "NaN or infinite" in output
    assert not (tmp_path / "gnq.duckdb").exists()


def test_an_integer_weight_where_the_model_has_floats_is_refused(tmp_path, series_and_data):
    """A weight stored as int8 (a quantized checkpoint without its scales) was cast silently and
    audited as another model; integer buffers are not weights and stay accepted."""
    import torch

    series, data = series_and_data
    file = series / "epoch-1" / "model.safetensors"
    state = load_file(file)
    name = next(k for k in state if k.endswith("mlp.c_fc.weight"))
    state[name] = state[name].round().to(torch.int8)
    save_file(state, file, metadata={"format": "pt"})
    code, output = audit(series, data, tmp_path / "gnq.duckdb")
    assert code == 1 and f"{name!r} is stored as int8, not floating point" in one_line(output)
    assert not (tmp_path / "gnq.duckdb").exists()


def test_integer_buffers_are_not_weights():
    import torch

    from gnq_core.sources.checkpoints.values import integer_weight

    state = {"model.pos_ids": torch.zeros(3, dtype=torch.int64), "model.w": torch.zeros(2)}
    assert integer_weight(state, ["model.w"]) is None
    assert integer_weight({**state, "w": torch.zeros(2, dtype=torch.int8)}, ["model.w"]) == \
        "tensor 'w' is stored as int8, not floating point"


def test_a_run_of_mostly_nonfinite_batches_fails_loudly(tmp_path, series_and_data, monkeypatch):
    series, data = series_and_data
    _poison(series)
    monkeypatch.setenv("GNQ_ALLOW_NONFINITE", "1")
    code, output = audit(series, data, tmp_path / "gnq.duckdb")
    assert code == 1 and "3 of 3 batches were non-finite" in one_line(output)
    row = Store(tmp_path / "gnq.duckdb").runs().iloc[0]
    assert row["status"] == "failed" and "non-finite" in row["message"]
