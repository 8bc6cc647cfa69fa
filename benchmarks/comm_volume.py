"""Global-scope GNQ: bytes communicated per step vs batch size and sequence length, by strategy.

    python -m benchmarks.comm_volume                  # 2 processes, gloo on CPU
    python -m benchmarks.comm_volume --batches 4 8 --lengths 32 64 --repeats 2

Each point is a real DDP training step of a GPT-2-shaped model on 2 processes with
``DistributedGNQAuditor(scope="global")``; the bytes are those of the tensors actually handed to
``all_gather`` (per rank, padding included), split into per-layer factors, per-example
gradients, the B×B kernel rows and small shape headers.  Strategies: "factors" (always send X
and Δ), "gradients" (always send per-example gradients), "auto" (per layer, the fewer bytes).
Times are medians of interleaved repeats of the whole step (forward, backward with the gathers,
compute, optimizer step) next to the plain DDP step and the rank-scope auditor (no
communication); on a shared 2-core CPU they are indicative only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import GPT2Config, GPT2LMHeadModel

from gnq_core import per_example_lm_loss
from gnq_core.engine.passes.distributed import DistributedGNQAuditor

from .common import interleaved, write

MODEL = dict(n_layer=2, n_embd=128, n_head=4, vocab_size=4096)
VARIANTS = {"plain": None, "rank": {"scope": "rank"}, "factors": {"strategy": "factors"},
            "gradients": {"strategy": "gradients"}, "auto": {"strategy": "auto"}}


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(minutes=10))
    torch.manual_seed(0)
    cfg = GPT2Config(n_positions=max(args.lengths), bos_token_id=0, eos_token_id=0, **MODEL)
    model = GPT2LMHeadModel(cfg).train()
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    auditors = {name: DistributedGNQAuditor(ddp, lam=1e-2, check_uses=False, **({"scope": "global"} | kw))
                if kw is not None else None for name, kw in VARIANTS.items()}
    rows = []
    for B in args.batches:
        for T in args.lengths:
            gen = torch.Generator().manual_seed(1000 * rank + B + T)
            ids = torch.randint(1, cfg.vocab_size, (B, T), generator=gen)
            weights = torch.full((B,), 1.0 / B)
            comm: dict[str, dict] = {}

            def step(name: str, ids=ids, weights=weights, comm=comm) -> None:
                auditor = auditors[name]
                with contextlib.ExitStack() as stack:  # only this variant's hooks are live
                    for other in auditors.values():
                        if other is not None and other is not auditor:
                            stack.enter_context(other.paused())
                    per_example_lm_loss(ddp(input_ids=ids).logits, ids).mean().backward()
                    if auditor is not None:
                        res = auditor.compute(weights=weights)
                        comm[name] = {"bytes_sent": res.comm.bytes_sent,
                                      "bytes_received": res.comm.bytes_received,
                                      "by_kind": dict(res.comm.by_kind), "layers": dict(res.comm.layers)}
                opt.step()
                opt.zero_grad(set_to_none=True)

            fns = {name: (lambda name=name: step(name)) for name in VARIANTS}
            for fn in fns.values():  # warm-up
                fn()
            times = interleaved(fns, args.repeats, sync=dist.barrier)
            row = {"batch_per_rank": B, "global_batch": B * world, "length": T,
                   "step_s": {k: v["median_s"] for k, v in times.items()},
                   **{k: comm[k] for k in VARIANTS if k in comm and k != "rank"}}
            rows.append(row)
            if rank == 0:
                mb = {k: row[k]["bytes_sent"] / 2**20 for k in ("factors", "gradients", "auto")}
                print(f"B={B:3d}/rank T={T:4d}: MiB sent per rank: factors {mb['factors']:8.2f}  "
                      f"gradients {mb['gradients']:8.2f}  auto {mb['auto']:8.2f}   step s: "
                      + "  ".join(f"{k} {v:.3f}" for k, v in row["step_s"].items()), flush=True)
    for a in auditors.values():
        if a is not None:
            a.close()
    if rank == 0:
        queue.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[4, 8, 16], help="examples per rank")
    ap.add_argument("--lengths", type=int, nargs="+", default=[32, 64, 128, 256])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    world = 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(world, port, args, queue), nprocs=world, start_method="spawn")
    rows = queue.get()
    cfg = GPT2Config(n_positions=max(args.lengths), bos_token_id=0, eos_token_id=0, **MODEL)
    n_params = sum(p.numel() for p in GPT2LMHeadModel(cfg).parameters())
    path = write("comm_volume", {"world_size": world, "backend": "gloo", "model": MODEL | {
        "parameters": n_params}, "dtype": "float32", "repeats": args.repeats, "results": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
