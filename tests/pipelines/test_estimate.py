"""The audit-time estimate shown before Start: measured throughput scaled by
parameters × tokens, and the parameter count read from a checkpoint without loading it."""

from __future__ import annotations

import json
import os

import pytest
import torch

from gnq_core.pipelines.estimate import (
    AUDIT_MEASURED,
    EXTRACT_MEASURED,
    STARTUP_S,
    Measured,
    estimate_audit,
    fit,
    tokens_per_text,
)
from gnq_core.sources import parameter_count, save_checkpoint
from gnq_core.sources.models import build_model, train_tokenizer


@pytest.mark.parametrize("rows", [AUDIT_MEASURED, EXTRACT_MEASURED])
def test_the_fit_reproduces_both_measurements(rows):
    rate = fit(rows)
    for row in rows:
        assert rate.seconds(row.parameters, row.tokens) == pytest.approx(1 / row.per_s, rel=1e-9)
    assert rate.fixed_s >= 0 and rate.per_s > 0


def test_the_benchmark_itself_is_estimated_as_measured():
    # README: 512 texts, 2 checkpoints of the small preset took 28.0 s (audit_s in the JSON, 2 s of
    # imports not included there)
    small = AUDIT_MEASURED[-1]
    est = estimate_audit(parameters=small.parameters, texts=512, checkpoints=2, tokens=small.tokens)
    assert est.audit_s - STARTUP_S == pytest.approx(512 * 2 / small.per_s, rel=1e-9)
    assert est.attack_s == 0 and est.total_s == est.audit_s


def test_the_estimate_scales_with_each_input():
    base = dict(parameters=10_000_000, texts=100, checkpoints=2, tokens=50.0)
    one = estimate_audit(**base).audit_s - STARTUP_S
    assert estimate_audit(**{**base, "texts": 200}).audit_s - STARTUP_S == pytest.approx(2 * one)
    assert estimate_audit(**{**base, "checkpoints": 4}).audit_s - STARTUP_S == pytest.approx(2 * one)
    bigger = estimate_audit(**{**base, "parameters": 1_000_000_000}).audit_s
    longer = estimate_audit(**{**base, "tokens": 500.0}).audit_s
    assert bigger > 50 * one and longer > 5 * one  # the parameters × tokens term dominates
    attacked = estimate_audit(**base, attack=True)
    assert attacked.attack_s > STARTUP_S and attacked.total_s == attacked.audit_s + attacked.attack_s
    assert all(w in attacked.basis
               for w in ("10.0M parameters", "docs/performance.md", "≈50 tokens", "gnq extract"))
    # the compute term at one thread is twice the benchmark's two; the fixed cost per text is not scaled
    rate = fit(AUDIT_MEASURED)
    one_thread = estimate_audit(**base, threads=1).audit_s - STARTUP_S
    assert one_thread == pytest.approx(one + 100 * 2 * 10_000_000 * 50.0 / rate.per_s)
    with pytest.raises(ValueError):
        estimate_audit(**base, threads=0)
    assert "1.5B parameters" in estimate_audit(**{**base, "parameters": 1_500_000_000}).basis
    assert "370,432 parameters" in estimate_audit(**{**base, "parameters": 370_432}).basis


def test_tokens_per_text_is_capped_by_max_length():
    assert tokens_per_text(400.0, 128) == 100.0
    assert tokens_per_text(4000.0, 128) == 128.0
    assert tokens_per_text(0.0, 128) == 1.0


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError):
        estimate_audit(parameters=-1, texts=1, checkpoints=1, tokens=1.0)
    with pytest.raises(ValueError):
        fit((Measured("a", 1, 1.0, 10.0), Measured("b", 1, 1.0, 5.0)))


def test_parameter_count_reads_the_safetensors_header(tmp_path):
    tokenizer = train_tokenizer(["a first text", "a second one"], vocab_size=300)
    model = build_model("tiny", len(tokenizer), 16, seed=0)
    save_checkpoint(model, tokenizer, tmp_path / "ckpt")
    # the tied head is stored once, as it is one parameter
    assert parameter_count(tmp_path / "ckpt") == sum(p.numel() for p in model.parameters())
    assert parameter_count(tmp_path / "nothing") is None


def test_parameter_count_of_pickled_weights_is_their_float32_size(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    torch.save({"w": torch.zeros(10, 30)}, folder / "pytorch_model.bin")
    count = parameter_count(folder)
    assert count is not None and 300 <= count <= 300 + (folder / "pytorch_model.bin").stat().st_size // 4


def test_the_thread_default_is_the_idle_cores():
    from gnq_core.common.runtime import default_threads, idle_cores

    assert idle_cores(16, 0.2) == 16 and idle_cores(16, 5.6) == 10
    assert idle_cores(2, 7.0) == 1 and idle_cores(4, -1.0) == 4  # at least 1, at most the cores
    assert 1 <= default_threads() <= (os.cpu_count() or 1)
