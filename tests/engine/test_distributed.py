"""Distributed in-run GNQ: 2 processes under torchrun (gloo, CPU), compared with one process.

tests/dist_worker.py runs each scenario on both ranks (DDP, one AdamW step) and saves its GNQ
result and the parameters after the step; here the same numbers are computed by the
single-process ``GNQAuditor``: on each rank's micro-batch (scope "rank") and on the
concatenated global batch (scope "global"), float64, rel. error ≤ 1e-9.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TOL, kernel_err, rel_err
from dist_worker import LAM, lm_losses, mlp_losses
from lm_fixtures import PAD_ID, tiny_gpt2
from torch import nn

from gnq_core import GNQAuditor
from gnq_core.engine.passes.distributed import DistributedGNQAuditor
from gnq_core.engine.passes.micro import MicroAuditor
from gnq_core.engine.passes.window import WindowAuditor

HERE = Path(__file__).resolve().parents[1]  # tests/, the workers' folder
SCENARIOS = ["rank", "global", "global-factors", "global-gradients"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_ranks(worker: str, out: Path) -> list[dict]:
    """Runs tests/``worker`` as 2 gloo ranks under torchrun; each rank's saved ``rank{r}.pt``."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           str(HERE / worker), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return torchrun_ranks("dist_worker.py", tmp_path_factory.mktemp("dist"))


def concat_lm(batches: list[dict]) -> dict:
    """The ranks' micro-batches as one right-padded batch."""
    T = max(b["input_ids"].shape[1] for b in batches)
    fill = {"input_ids": PAD_ID, "attention_mask": 0, "labels": -100}
    return {k: torch.cat([nn.functional.pad(b[k], (0, T - b[k].shape[1]), value=v) for b in batches])
            for k, v in fill.items()}


def single_process(model: nn.Module, loss_fn, batch):
    with GNQAuditor(model, lam=LAM) as auditor:
        losses = loss_fn(model, batch)
        losses.mean().backward()
        B = losses.shape[0]
        return auditor.compute(weights=torch.full((B,), 1.0 / B))


def models(ranks):
    def lm():
        m = tiny_gpt2()
        m.load_state_dict(ranks[0]["lm_init"])
        return m

    def mlp():
        m = nn.Sequential(nn.Linear(20, 8), nn.Tanh(), nn.Linear(8, 4))
        m.load_state_dict(ranks[0]["mlp_init"])
        return m

    return {"lm": (lm, lm_losses), "mlp": (mlp, mlp_losses)}


@pytest.mark.parametrize("kind", ["lm", "mlp"])
def test_rank_scope_equals_single_process_on_each_micro_batch(ranks, kind):
    build, loss_fn = models(ranks)[kind]
    for r, saved in enumerate(ranks):
        res = saved[kind]["rank"]["result"]
        ref = single_process(build(), loss_fn, saved[f"{kind}_batch"])
        assert res["scope"] == "rank" and res["offset"] == 0 and res["bytes_sent"] == 0
        assert res["gnq"].shape == ref.gnq.shape, f"rank {r}"
        assert rel_err(res["gnq"], ref.gnq) <= TOL
        assert kernel_err(res["kernel"], ref.kernel) <= TOL


@pytest.mark.parametrize("scenario", SCENARIOS[1:])
@pytest.mark.parametrize("kind", ["lm", "mlp"])
def test_global_scope_equals_single_process_on_concatenated_batch(ranks, kind, scenario):
    build, loss_fn = models(ranks)[kind]
    if kind == "lm":
        batch = concat_lm([s["lm_batch"] for s in ranks])
    else:
        batch = tuple(torch.cat([s["mlp_batch"][i] for s in ranks]) for i in range(2))
    ref = single_process(build(), loss_fn, batch)
    sizes = [s[f"{kind}_batch"][0].shape[0] if kind == "mlp" else s["lm_batch"]["input_ids"].shape[0]
             for s in ranks]
    assert sizes[0] != sizes[1]  # uneven micro-batches
    for r, saved in enumerate(ranks):
        res = saved[kind][scenario]["result"]
        assert res["sizes"] == sizes and res["offset"] == sum(sizes[:r]) and res["local_size"] == sizes[r]
        assert rel_err(res["gnq"], ref.gnq) <= TOL, f"rank {r}"
        assert kernel_err(res["kernel"], ref.kernel) <= TOL
        assert res["bytes_sent"] > 0 and res["bytes_received"] == res["bytes_sent"]  # 2 ranks
    # the global batch is not the micro-batch: GNQ against more examples is smaller
    local = ranks[0][kind]["rank"]["result"]["gnq"]
    assert (ranks[0][kind][scenario]["result"]["gnq"][: len(local)] < local).all()


def test_fsdp_global_scope_equals_single_process_and_keeps_the_step(ranks):
    build, loss_fn = models(ranks)["lm"]
    ref = single_process(build(), loss_fn, concat_lm([s["lm_batch"] for s in ranks]))
    for saved in ranks:
        res = saved["lm"]["fsdp-global"]["result"]
        assert rel_err(res["gnq"], ref.gnq) <= TOL
        assert kernel_err(res["kernel"], ref.kernel) <= TOL
        plain, audited = saved["lm"]["fsdp-plain"]["params"], saved["lm"]["fsdp-global"]["params"]
        assert all(torch.equal(audited[n], plain[n]) for n in plain)
        ddp = saved["lm"]["plain"]["params"]  # FSDP's step is DDP's step up to float rounding
        assert all(torch.allclose(plain[n], ddp[n], rtol=0, atol=1e-12) for n in plain)


def test_strategies_send_what_they_say(ranks):
    res = {s: ranks[0]["lm"][s]["result"] for s in SCENARIOS[1:]}
    assert set(res["global-factors"]["layers"]) == {"factors"}
    assert res["global-factors"]["by_kind"].get("gradients", 0) == 0
    assert res["global-gradients"]["by_kind"]["gradients"] > 0
    # the per-layer choice sends no more than either fixed strategy
    payload = {s: r["by_kind"].get("factors", 0) + r["by_kind"].get("gradients", 0) for s, r in res.items()}
    assert payload["global"] <= min(payload["global-factors"], payload["global-gradients"])


@pytest.mark.parametrize("kind", ["lm", "mlp"])
def test_parameters_after_a_step_are_unchanged_by_auditing(ranks, kind):
    for saved in ranks:
        plain = saved[kind]["plain"]["params"]
        for scenario in SCENARIOS:
            params = saved[kind][scenario]["params"]
            if scenario == "rank":  # fused: Σ_j G_j instead of one matmul, equal to float rounding;
                # compared before the step: AdamW turns the rounding noise of a gradient that is
                # zero analytically (GPT-2's key bias) into ±lr
                grads, plain_grads = saved[kind][scenario]["grads"], saved[kind]["plain"]["grads"]
                assert grads.keys() == plain_grads.keys()
                for n in plain_grads:
                    torch.testing.assert_close(grads[n], plain_grads[n], rtol=1e-12, atol=1e-15, msg=n)
            else:
                assert all(torch.equal(params[n], plain[n]) for n in plain), scenario
    # and DDP kept the ranks in sync
    assert all(torch.equal(ranks[0][kind]["plain"]["params"][n], ranks[1][kind]["plain"]["params"][n])
               for n in ranks[0][kind]["plain"]["params"])


def test_without_process_group_global_scope_is_the_plain_auditor():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 8), nn.Tanh(), nn.Linear(8, 4))
    x, y = torch.randn(6, 20), torch.randint(0, 4, (6,))
    with DistributedGNQAuditor(model, lam=LAM) as auditor:
        mlp_losses(model, (x, y)).sum().backward()
        res = auditor.compute()
    model.zero_grad()
    ref = single_process(model, mlp_losses, (x, y))
    assert res.world_size == 1 and res.comm.bytes_sent == 0
    assert rel_err(res.gnq, ref.gnq) <= TOL


def test_the_door_builds_the_implementation_for_batch_and_scope():
    """GNQAuditor(batch=, scope=) returns the class for the pair, each a GNQAuditor; what one
    process cannot do, or an option of the other batch or scope, is one line at construction."""
    model = nn.Linear(3, 2)
    for batch, cls in (("micro", MicroAuditor), ("step", WindowAuditor)):
        with GNQAuditor(model, LAM, batch=batch) as auditor:
            assert type(auditor) is cls and isinstance(auditor, GNQAuditor)
    for kwargs, says in [({"scope": "global"}, "none is initialised"),
                         ({"batch": "step", "scope": "global"}, "none is initialised"),
                         ({"mode": "sketch"}, "mode= applies only to batch='step'"),
                         ({"strategy": "factors"}, "strategy= applies only to scope='global'"),
                         ({"batch": "step", "fused": True}, "fused=True applies only to batch='micro'"),
                         ({"batch": "epoch"}, "batch must be one of 'micro', 'step'"),
                         ({"scope": "world"}, "scope must be one of 'rank', 'global'")]:
        with pytest.raises(ValueError, match=re.escape(says)) as err:
            GNQAuditor(model, LAM, **kwargs)
        assert "\n" not in str(err.value)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_the_door_unwraps_a_ddp_model_for_scope_rank():
    """A DDP-wrapped model under scope='rank': hooks on the inner model, the plain auditor's GNQ."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 8), nn.Tanh(), nn.Linear(8, 4))
    x, y = torch.randn(6, 20), torch.randint(0, 4, (6,))
    wrapper = type("DistributedDataParallel", (nn.Module,), {"forward": lambda self, *a: self.module(*a)})()
    wrapper.module = model
    with GNQAuditor(wrapper, lam=LAM) as auditor:
        mlp_losses(wrapper, (x, y)).sum().backward()
        res = auditor.compute()
    assert auditor.model is model
    model.zero_grad()
    assert rel_err(res.gnq, single_process(model, mlp_losses, (x, y)).gnq) <= TOL


def test_fused_global_is_refused():
    with pytest.raises(ValueError, match="fused"):
        DistributedGNQAuditor(nn.Linear(3, 2), scope="global", fused=True)
