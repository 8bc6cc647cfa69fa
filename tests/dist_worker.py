"""One rank of tests/engine/test_distributed.py (started by torchrun, gloo on CPU, float64).

Every scenario starts from the same initial weights, wraps the model in DDP, runs one forward,
``losses.mean().backward()`` and one AdamW step, and saves what the test compares: the GNQ
result of each scope/strategy and the parameters after the step (also without any auditor).
The ranks' micro-batches differ in size and padded length.  The GPT-2 also runs under FSDP2
(``fully_shard``), plain and with the global-scope auditor.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from lm_fixtures import lm_batch, tiny_gpt2
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from gnq_core import GNQAuditor, per_example_lm_loss
from gnq_core.engine.passes.distributed import DistributedGNQAuditor

LAM = 1e-2
LM_SIZES = [[9, 5, 12], [7, 10, 4, 6]]  # token lengths of each rank's examples
MLP_SIZES = [5, 3]


def lm_micro_batch(rank: int) -> dict[str, torch.Tensor]:
    """This rank's slice of one global batch, cut to its own longest example."""
    sizes = [n for part in LM_SIZES for n in part]
    full = lm_batch(sizes, seed=3)
    start = sum(len(p) for p in LM_SIZES[:rank])
    rows = slice(start, start + len(LM_SIZES[rank]))
    T = int(full["attention_mask"][rows].sum(1).max())
    return {k: v[rows, :T].clone() for k, v in full.items()}


def mlp_micro_batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10 + rank)
    B = MLP_SIZES[rank]
    return torch.randn(B, 20, generator=g), torch.randint(0, 4, (B,), generator=g)


def lm_losses(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return per_example_lm_loss(out.logits, batch["labels"])


def mlp_losses(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y, reduction="none")


def fsdp(model: nn.Module) -> nn.Module:
    """FSDP2: every transformer block its own unit, then the root (parameters become DTensor shards)."""
    for block in model.transformer.h:
        fully_shard(block)
    return fully_shard(model)


def full(p: torch.Tensor) -> torch.Tensor:
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def scenario(build, init_state, loss_fn, batch, audit: dict | None, wrap=DDP) -> dict:
    model = build()
    model.load_state_dict(init_state)
    ddp = wrap(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # the global scopes through the public door; "rank" keeps the distributed class's result
    # (offset, sizes, comm) to check it needs no communication
    door = GNQAuditor if audit and audit["scope"] == "global" else DistributedGNQAuditor
    auditor = door(ddp, lam=LAM, **audit) if audit is not None else None
    try:
        losses = loss_fn(ddp, batch)
        losses.mean().backward()
        res = None
        if auditor is not None:
            B = losses.shape[0]
            r = auditor.compute(weights=torch.full((B,), 1.0 / B))
            res = {"gnq": r.gnq, "kernel": r.kernel, "offset": r.offset, "local_size": r.local_size,
                   "sizes": r.sizes, "scope": r.scope, "bytes_sent": r.comm.bytes_sent,
                   "bytes_received": r.comm.bytes_received, "by_kind": dict(r.comm.by_kind),
                   "layers": dict(r.comm.layers)}
        grads = {n: full(p.grad).clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
    finally:
        if auditor is not None:
            auditor.close()
    return {"result": res, "grads": grads,
            "params": {n: full(p.detach()).clone() for n, p in model.named_parameters()}}


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    lm_init = tiny_gpt2().state_dict()

    def mlp() -> nn.Module:
        return nn.Sequential(nn.Linear(20, 8), nn.Tanh(), nn.Linear(8, 4))

    mlp_init = mlp().state_dict()
    lm, xy = lm_micro_batch(rank), mlp_micro_batch(rank)
    audits = {"plain": None, "rank": {"scope": "rank"}, "global": {"scope": "global"},
              "global-factors": {"scope": "global", "strategy": "factors"},
              "global-gradients": {"scope": "global", "strategy": "gradients"}}
    saved = {"lm_init": lm_init, "mlp_init": mlp_init, "lm_batch": lm, "mlp_batch": xy,
             "world": dist.get_world_size(), "lm": {}, "mlp": {}}
    for name, audit in audits.items():
        saved["lm"][name] = scenario(tiny_gpt2, lm_init, lm_losses, lm, audit)
        saved["mlp"][name] = scenario(mlp, mlp_init, mlp_losses, xy, audit)
    for name in ("plain", "global"):  # FSDP: sharded parameters, the same GNQ
        saved["lm"][f"fsdp-{name}"] = scenario(tiny_gpt2, lm_init, lm_losses, lm, audits[name], wrap=fsdp)
    torch.save(saved, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
