"""GNQ over an accumulation window pooled across DDP ranks (engine/passes/window_ddp.py): 2 processes
under torchrun (gloo, CPU, float64), each with a window of 2 micro-batches, compared with one
process auditing the same texts as one window (B_eff = micro × accumulation × world)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TOL, kernel_err, rel_err
from dist_window_worker import LAM, SPEC, audit_window, lm_losses
from lm_fixtures import tiny_gpt2
from test_distributed import concat_lm, free_port, torchrun_ranks

from gnq_core import GNQAuditor
from gnq_core.engine.math.reference import exact_gnq
from gnq_core.engine.passes.window_ddp import DistributedWindowAuditor

HERE = Path(__file__).resolve().parents[1]  # tests/, the workers' folder


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return torchrun_ranks("dist_window_worker.py", tmp_path_factory.mktemp("dist-window"))


def one_process_window(ranks: list[dict], parts: list[dict], **audit):
    """The same micro-batches, in rank order, as one window of one process."""
    model = tiny_gpt2()
    model.load_state_dict(ranks[0]["init"])
    return audit_window(GNQAuditor(model, LAM, batch="step", **audit), model, parts)


def every_part(ranks: list[dict]) -> list[dict]:
    return [p for saved in ranks for p in saved["parts"]]


def check_layout(ranks: list[dict], scenario: str) -> None:
    sizes = [sum(p["input_ids"].shape[0] for p in saved["parts"]) for saved in ranks]
    assert sizes == [4, 3]
    for r, saved in enumerate(ranks):
        res = saved[scenario]
        assert res["sizes"] == sizes and res["batch_size"] == 7 and res["micro_batches"] == 2
        assert res["offset"] == sum(sizes[:r]) and res["local_size"] == sizes[r]
        assert torch.equal(res["local_gnq"], res["gnq"][res["offset"]:res["offset"] + sizes[r]])
        assert res["bytes_sent"] > 0


def test_sketched_window_of_two_ranks_equals_one_process(ranks):
    check_layout(ranks, "sketch")
    ref = one_process_window(ranks, every_part(ranks), mode="sketch", sketch=SPEC)
    for saved in ranks:
        res = saved["sketch"]
        assert (res["mode"], res["k"], res["seed"]) == ("sketch", SPEC.k, SPEC.seed)
        assert rel_err(res["gnq"], ref.gnq) <= 1e-12  # the same sketches: equal to float rounding
        assert kernel_err(res["kernel"], ref.kernel) <= 1e-12
    assert torch.equal(ranks[0]["sketch"]["gnq"], ranks[1]["sketch"]["gnq"])  # one solve, every rank


def test_exact_window_of_two_ranks_equals_one_batch(ranks):
    """The exact window of 2 ranks × 2 micro-batches equals the GNQ of all 7 texts as one batch
    (reference: torch.func per-example gradients), float64, ≤ 1e-9."""
    check_layout(ranks, "exact")
    model = tiny_gpt2()
    model.load_state_dict(ranks[0]["init"])
    ref = exact_gnq(model, lm_losses, concat_lm(every_part(ranks)), LAM)
    for saved in ranks:
        res = saved["exact"]
        assert res["mode"] == "exact" and res["k"] is None
        assert kernel_err(res["kernel"], ref.kernel) <= TOL
        assert rel_err(res["gnq"], ref.gnq) <= TOL
    # the window of all ranks is not a rank's window: more companions explain more of each gradient
    own = one_process_window(ranks, ranks[0]["parts"], mode="exact")
    assert (ranks[0]["exact"]["local_gnq"] < own.gnq).all()


def test_one_rank_past_its_budget_sketches_every_rank(ranks):
    for saved in ranks:
        assert saved["auto"]["mode"] == "sketch"
        assert rel_err(saved["auto"]["gnq"], saved["sketch"]["gnq"]) <= 1e-12


def test_a_non_finite_micro_batch_on_one_rank_fails_the_window_on_every_rank(ranks):
    for r, saved in enumerate(ranks):
        raised = saved["nan"]["raised"]
        assert len(raised) == 1, f"rank {r}"
        if r == 0:  # its own window was finite: it names the rank that was not
            assert "rank 1 had a non-finite loss or gradient" in raised[0]
    # the next window is scored as usual
    assert torch.equal(ranks[0]["nan"]["gnq"], ranks[1]["nan"]["gnq"])
    assert rel_err(ranks[0]["nan"]["gnq"], ranks[0]["exact"]["gnq"]) <= TOL


def test_without_process_group_it_is_the_window_auditor():
    torch.manual_seed(0)
    from lm_fixtures import lm_batch

    model = tiny_gpt2()
    batch = lm_batch([6, 8, 5], seed=2)
    with DistributedWindowAuditor(model, LAM, mode="exact") as auditor:
        lm_losses(model, batch).sum().backward()
        auditor.add_micro_batch()
        res = auditor.finish_window()
    ref = exact_gnq(model, lm_losses, batch, LAM)
    assert res.world_size == 1 and res.sizes == [3] and res.comm.bytes_sent == 0
    assert rel_err(res.gnq, ref.gnq) <= TOL


def test_trainer_under_torchrun_scores_every_ranks_window(tmp_path):
    """examples/finetune_with_gnq.py under torchrun (2 processes): the GNQ batch is the update's,
    micro 2 × accumulation 2 × world 2 = 8 texts, stated in run.json and the Trainer's logs; each
    rank writes its own texts, rank 0 the batch row."""
    import json

    import pandas as pd

    root = HERE.parent
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           str(root / "examples" / "finetune_with_gnq.py"),
           "--out", str(tmp_path / "ft"), "--max-steps", "1", "--batch-size", "2", "--grad-accum", "2"]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "'gnq/b_eff': 8" in proc.stdout
    shards = tmp_path / "ft" / "shards"
    settings = json.loads((shards / "run.json").read_text())["run"]["settings"]
    assert settings["b_eff"] == 8 and settings["world_size"] == 2 and settings["scope"] == "global"
    assert "on each of 2 processes (B_eff = 8)" in settings["gnq_batch"]
    batches = [pd.read_parquet(shards / "batches" / f"rank-0000{r}.steps-00000001-00000001.parquet")
               for r in range(2)]
    assert len(batches[0]) == 1 and batches[0]["size"].iloc[0] == 8 and len(batches[1]) == 0
    scores = [pd.read_parquet(shards / "scores" / f"rank-0000{r}.steps-00000001-00000001.parquet")
              for r in range(2)]
    assert [len(s) for s in scores] == [4, 4] and all(s["gnq"].notna().all() for s in scores)
    assert set(scores[0]["example_id"]).isdisjoint(scores[1]["example_id"])
