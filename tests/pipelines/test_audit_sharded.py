"""`torchrun --nproc-per-node 2 gnq audit --shard-model ...` (FSDP2, gloo on CPU, float64): each
rank holds about half of each checkpoint, and the stored GNQ of every text is the one process's
(the batch is the audit unit), for a tied GPT-2 and an untied Llama (RMSNorm through the generic
per-example kernel, inside its block's gathered backward)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from lm_fixtures import texts, tiny_llama
from test_distributed import free_port
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.pipelines.sharding import lockstep, transformer_blocks
from gnq_core.results.store import Store
from gnq_core.sources.checkpoints.save import save_checkpoint
from gnq_core.sources.models import build_model, train_tokenizer

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
N_TEXTS = 26  # 7 batches of 4 (the last of 2): one rank runs 4, the other 3 and a lockstep copy
ARGS = ["--lam", "0.05", "--batch-size", "4", "--max-length", "24", "--seed", "5", "--dtype", "float64",
        "--quiet", "--threads", "1"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[dict[str, Path], Path]:
    root = tmp_path_factory.mktemp("sharded")
    tok = train_tokenizer(texts(200), vocab_size=300)
    save_checkpoint(build_model("tiny", len(tok), 32, seed=1), tok, root / "gpt2")
    save_checkpoint(tiny_llama(vocab_size=len(tok)), tok, root / "llama")
    data = root / "texts.txt"
    data.write_text("\n".join(texts(N_TEXTS)) + "\n", encoding="utf-8")
    return {"gpt2": root / "gpt2", "llama": root / "llama"}, data


def scores(db: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    store = Store(db)
    run = store.run("a")
    assert run.status == "done"
    batches = store.batches(run.run_id).drop(columns=["seconds"])
    return store.scores(run.run_id).reset_index(drop=True), batches


def sharded_audit(folder: Path, data: Path, db: Path, out: Path) -> list[dict]:
    out.mkdir()
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), str(TESTS / "dist_shard_worker.py"), str(out),
           "audit", "--checkpoints", str(folder), "--data", str(data), "--db", str(db), "--name", "a",
           "--shard-model", *ARGS]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_two_sharded_ranks_store_the_gnq_of_one_process(folders, tmp_path, model):
    found, data = folders
    one, two = tmp_path / "one.duckdb", tmp_path / "two.duckdb"
    result = CliRunner().invoke(app, ["audit", "--checkpoints", str(found[model]), "--data", str(data),
                                      "--db", str(one), "--name", "a", *ARGS], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    ranks = sharded_audit(found[model], data, two, tmp_path / "out")
    # each rank held about half of the parameters, and together all of them, once
    held = [r["held"][0] for r in ranks]
    total = held[0]["total"]
    assert held[0]["blocks"] == 2 and held[0]["total"] == held[1]["total"]
    assert held[0]["held"] + held[1]["held"] == total
    assert all(0.4 < h["held"] / total < 0.6 for h in held), held
    # 7 batches over 2 ranks: rank 0 audits 0, 2, 4, 6; rank 1 audits 1, 3, 5 and reruns 5 in step
    assert ranks[0]["passes"] == [{"runs": [0, 2, 4, 6], "padding": 0}]
    assert ranks[1]["passes"] == [{"runs": [1, 3, 5, 5], "padding": 1}]
    (single, single_batches), (sharded, sharded_batches) = scores(one), scores(two)
    assert len(single) == N_TEXTS and single["gnq"].notna().all()
    assert list(sharded["example_id"]) == list(single["example_id"])  # every text once: the copy dropped
    gnq, ref = sharded["gnq"].to_numpy(), single["gnq"].to_numpy()
    assert np.max(np.abs(gnq - ref) / np.abs(ref)) <= 1e-9
    pd.testing.assert_frame_equal(sharded, single, check_exact=False, rtol=1e-9)
    assert len(single_batches) == 7
    pd.testing.assert_frame_equal(sharded_batches, single_batches, check_exact=False, rtol=1e-9)


def test_shard_model_without_torchrun_is_refused_in_one_line(folders, tmp_path):
    found, data = folders
    db = tmp_path / "gnq.duckdb"
    for extra, says in [([], "--shard-model shards the model over the processes of torchrun"),
                        (["--companions", "4"], "--companions (each text against the others' sketches) "
                                                "is not sharded yet")]:
        result = CliRunner().invoke(app, ["audit", "--checkpoints", str(found["gpt2"]), "--data", str(data),
                                          "--db", str(db), "--name", "a", "--shard-model", *ARGS, *extra])
        assert result.exit_code == 1
        assert says in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert not db.exists()


def test_the_blocks_are_found_generically():
    from lm_fixtures import tiny_gpt2
    from torch import nn

    gpt2, llama = tiny_gpt2(), tiny_llama()
    assert transformer_blocks(gpt2) == list(gpt2.transformer.h)  # GPT2Block, by _no_split_modules
    assert transformer_blocks(llama) == list(llama.model.layers)  # LlamaDecoderLayer
    layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
    plain = nn.Sequential(nn.Embedding(5, 4), layers, nn.Linear(4, 5))
    assert transformer_blocks(plain) == list(plain[1])  # no _no_split_modules: the layer list
    assert transformer_blocks(nn.Linear(3, 2)) == []


def test_lockstep_runs_as_many_passes_on_every_rank():
    for n, world in [(7, 2), (6, 2), (1, 2), (5, 3)]:
        runs = [lockstep(list(range(r, n, world)), n, world) for r in range(world)]
        assert len({len(x) for x in runs}) == 1 and len(runs[0]) == -(-n // world)
        assert all(set(x) <= set(range(n)) for x in runs)


def test_the_memory_plan_of_a_sharded_gpu_audit_holds_a_share_of_the_weights(folders):
    from gnq_core.sources.memory_plan import model_shape, plan_for_batch

    shape = model_shape(folders[0]["llama"])

    def terms(device: str, shards: int) -> dict[str, int]:
        plan = plan_for_batch(shape, batch_size=4, max_length=24, dtype="float64", checkpoints=2,
                              device=device, room=1 << 40, room_source="test", shards=shards)
        return {t.name: t.bytes for t in plan.terms}

    whole, sharded = terms("cuda", 1), terms("cuda", 4)
    assert whole["weights"] == shape.parameters * 8 and sharded["weights"] == -(-shape.parameters * 8 // 4)
    assert 0 < sharded["gathered units"] <= whole["weights"]  # two units, never more than the model
    assert sharded["next checkpoint"] == 0 < whole["next checkpoint"]  # read into host memory when sharded
    assert terms("cpu", 4) == terms("cpu", 1)  # on CPU every rank reads the whole checkpoint first
