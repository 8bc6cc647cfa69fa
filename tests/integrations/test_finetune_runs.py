"""What a fine-tuning run records is true — the project's example runs, run.json's
max_length and epochs, the precision of the gradients (Trainer bf16, a user's autocast) — and
``--dtype`` takes exactly what its --help says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lm_fixtures import PAD_ID, texts, tiny_gpt2, tiny_llama, tokenizer
from transformers import TrainingArguments
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.integrations.hf import GNQConfig, GNQTrainer, lm_collator
from gnq_core.results.precision import precision_note

ROOT = Path(__file__).resolve().parents[2]
N_ROWS = 12


def rows() -> list[dict]:
    tok = tokenizer()
    pool = texts()
    return [{"input_ids": tok.encode(pool[i]).ids[: 4 + (3 * i) % 11], "example_id": i}
            for i in range(N_ROWS)]


def train(tmp_path: Path, model: torch.nn.Module, **kw) -> tuple[GNQTrainer, dict]:
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=3,
                             num_train_epochs=kw.pop("epochs", 1), learning_rate=1e-3, report_to=[],
                             save_strategy="no", logging_strategy="no", use_cpu=True, seed=0,
                             disable_tqdm=True, **kw)
    trainer = GNQTrainer(model=model, args=args, train_dataset=rows(), data_collator=lm_collator(PAD_ID),
                         gnq=GNQConfig(out=tmp_path / "shards", lam=1e-2, texts=texts()[:N_ROWS]))
    trainer.train()
    return trainer, json.loads((tmp_path / "shards" / "run.json").read_text())["run"]


def test_the_example_runs(tmp_path):
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "finetune_with_gnq.py"), "--out",
                          str(tmp_path / "ft"), "--max-steps", "2", "--epochs", "3"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "highest GNQ on rank 0:" in out.stdout
    run = json.loads((tmp_path / "ft" / "shards" / "run.json").read_text())["run"]
    assert run["settings"]["max_steps"] == 2 and run["settings"]["epochs"] == 1  # not the 3 asked for
    assert run["max_length"] == 64


def test_run_json_max_length_of_a_llama_and_epochs_under_max_steps(tmp_path):
    torch.manual_seed(0)
    _, run = train(tmp_path, tiny_llama(), max_steps=1, epochs=3)
    assert run["max_length"] == 64  # max_position_embeddings (was 0: Llama has no n_positions)
    assert run["settings"]["epochs"] == 1 and run["settings"]["max_steps"] == 1
    assert run["settings"]["mixed_precision"] == "no" and run["dtype"] == "float64"


def test_trainer_bf16_is_recorded_and_said(tmp_path, capfd):
    torch.manual_seed(0)
    trainer, run = train(tmp_path, tiny_gpt2().float(), bf16=True, max_steps=1)
    assert run["dtype"] == "bfloat16" and run["settings"]["compute_dtype"] == "bfloat16"
    assert run["settings"]["mixed_precision"] == "bf16" and run["settings"]["weights_dtype"] == "float32"
    err = capfd.readouterr().err
    said = "GNQ: gradients were bfloat16 (mixed precision bf16)"
    assert sum(said in line for line in err.splitlines()) == 1
    assert len(trainer.gnq.results) and trainer.gnq.results["gnq"].notna().all()


def test_a_users_own_autocast_is_recorded(tmp_path, capfd):
    torch.manual_seed(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, run = train(tmp_path, tiny_gpt2().float(), max_steps=1)
    assert run["settings"]["compute_dtype"] == "bfloat16"
    assert run["settings"]["mixed_precision"] == "torch.autocast(bfloat16)"
    assert "GNQ: gradients were bfloat16" in capfd.readouterr().err


def test_full_precision_runs_carry_no_note(tmp_path, capfd):
    torch.manual_seed(0)
    _, run = train(tmp_path, tiny_gpt2().double(), max_steps=1)
    assert run["dtype"] == "float64" and run["settings"]["mixed_precision"] == "no"
    assert "GNQ: gradients were" not in capfd.readouterr().err
    assert precision_note(run["settings"]) is None
    assert "tens of percent" in precision_note({"compute_dtype": "float16", "mixed_precision": "fp16"})


@pytest.mark.parametrize("dtype", ["half", "bf16", "fp32"])
def test_dtype_takes_what_its_help_says(dtype, tmp_path):
    runner = CliRunner()
    said = " ".join(runner.invoke(app, ["audit", "--help"]).output.split())
    assert all(name in said for name in ("auto", "float32", "float64", "bfloat16", "float16"))
    db = tmp_path / "gnq.duckdb"
    out = runner.invoke(app, ["audit", "--checkpoints", str(tmp_path), "--data",
                              str(ROOT / "data" / "demo.csv"), "--dtype", dtype, "--db", str(db)])
    assert out.exit_code == 1 and not db.exists()
    assert f"--dtype must be one of auto, float32, float64, bfloat16, float16, got {dtype!r}" in out.output
    assert len(out.output.strip().splitlines()) == 1


def compiled_whole(model):
    return torch.compile(model)


def compiled_in_place(model):
    model.compile()
    return model


def compiled_layer(model):
    model.transformer.h[1].compile()
    return model


@pytest.mark.parametrize("how", [compiled_whole, compiled_in_place, compiled_layer])
def test_torch_compile_is_refused_at_setup(how, tmp_path):
    """Not a crash in planning after minutes of compiling — one line before anything runs."""
    from gnq_core.engine.auditor import GNQAuditor
    from gnq_core.engine.passes.distributed import DistributedGNQAuditor
    from gnq_core.engine.plan.compiled import CompiledModelError

    with pytest.raises(CompiledModelError, match="torch.compile'd model .* compiled\\): train the audited"):
        DistributedGNQAuditor(how(tiny_gpt2()), scope="rank")
    with pytest.raises(CompiledModelError, match="train the audited run without torch.compile"):
        GNQAuditor(how(tiny_gpt2()))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=3, report_to=[],
                             use_cpu=True)
    with pytest.raises(CompiledModelError) as err:
        GNQTrainer(model=how(tiny_gpt2()), args=args, train_dataset=rows(), data_collator=lm_collator(PAD_ID),
                   gnq=GNQConfig(out=tmp_path / "shards"))
    assert len(str(err.value).splitlines()) == 1 and not (tmp_path / "shards").exists()


def test_trainer_torch_compile_is_refused_at_setup(tmp_path):
    from gnq_core.engine.plan.compiled import CompiledModelError

    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=3, report_to=[],
                             use_cpu=True, torch_compile=True)
    with pytest.raises(CompiledModelError, match="the Trainer would compile it"):
        GNQTrainer(model=tiny_gpt2(), args=args, train_dataset=rows(), data_collator=lm_collator(PAD_ID),
                   gnq=GNQConfig(out=tmp_path / "shards"))
    assert not (tmp_path / "shards").exists()
