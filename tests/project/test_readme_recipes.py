"""The fine-tuning recipes (docs/recipes.md) run as written: every ```python block in order in one namespace,
every `gnq ...` command of a ```bash block through the CLI, in a folder holding a tiny model
(models/base) and texts (data/texts.csv).  Each recipe's run.json / store row is then checked."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pandas as pd
import pytest
import torch
from lm_fixtures import texts, tiny_llama
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.results.store import Store
from gnq_core.sources.checkpoints.save import save_checkpoint
from gnq_core.sources.models import train_tokenizer

pytest.importorskip("peft")
pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```(python|bash)\n(.*?)```", re.S)


def recipes() -> list[tuple[str, str]]:
    return BLOCK.findall((ROOT / "docs" / "recipes.md").read_text(encoding="utf-8"))


def test_every_fine_tuning_recipe_runs(tmp_path, monkeypatch, capfd):
    torch.set_default_dtype(torch.float32)  # a practitioner's default (conftest restores float64)
    pool = list(texts()[:16])
    tok = train_tokenizer(list(texts()), vocab_size=320)
    torch.manual_seed(0)
    save_checkpoint(tiny_llama(vocab_size=len(tok)), tok, tmp_path / "models" / "base")
    (tmp_path / "data").mkdir()
    pd.DataFrame({"text": pool}).to_csv(tmp_path / "data" / "texts.csv", index=False)
    monkeypatch.chdir(tmp_path)
    blocks = recipes()
    assert [kind for kind, _ in blocks].count("python") == 6 and any(kind == "bash" for kind, _ in blocks)
    namespace: dict = {}
    for kind, code in blocks:
        if kind == "python":
            exec(compile(code, "docs/recipes.md", "exec"), namespace)  # noqa: S102
            continue
        command = code.replace("\\\n", " ").strip()
        assert command.startswith("gnq "), command
        out = CliRunner().invoke(app, [*shlex.split(command)[1:], "--quiet"])
        assert out.exit_code == 0, out.output
    for name in ("ft", "ckpt", "bf16", "lora", "sft"):
        run = json.loads((tmp_path / "runs" / f"{name}-shards" / "run.json").read_text())["run"]
        assert run["settings"]["mixed_precision"] == ("bf16" if name == "bf16" else "no"), name
    assert "GNQ: gradients were bfloat16" in capfd.readouterr().err
    store = Store(tmp_path / "gnq.duckdb")
    lora = store.run("lora")
    assert lora.settings["parameters"] == "adapter"
    assert store.scores(lora.run_id)["gnq"].notna().all()
