"""One rank of tests/engine/test_distributed_window.py (started by torchrun, gloo on CPU, float64).

Each rank runs one accumulation window of 2 micro-batches of its own texts through a DDP tiny
GPT-2 (tied head) with ``GNQAuditor(batch="step", scope="global")`` and saves the window's result: sketched,
exact, ``auto`` with a budget only rank 1 outgrows (so every rank must sketch), and a window that
fails on one rank only.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from lm_fixtures import lm_batch, tiny_gpt2
from torch.nn.parallel import DistributedDataParallel as DDP

from gnq_core import GNQAuditor, per_example_lm_loss
from gnq_core.engine.sketch.projection import SketchSpec

LAM = 1e-3
# token lengths of each rank's micro-batches (uneven: 4 texts on rank 0, 3 on rank 1)
SIZES = [[[9, 5], [12, 4]], [[7, 10], [6]]]
SPEC = SketchSpec(k=64, seed=5, vocab_rows=128)


def micro_batches(rank: int) -> list[dict[str, torch.Tensor]]:
    """This rank's micro-batches, each cut to its own longest text."""
    flat = [n for part in SIZES for micro in part for n in micro]
    full = lm_batch(flat, seed=4)
    start = sum(len(m) for part in SIZES[:rank] for m in part)
    out = []
    for micro in SIZES[rank]:
        rows = slice(start, start + len(micro))
        T = int(full["attention_mask"][rows].sum(1).max())
        out.append({k: v[rows, :T].clone() for k, v in full.items()})
        start += len(micro)
    return out


def lm_losses(model, batch):
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return per_example_lm_loss(out.logits, batch["labels"])


def audit_window(auditor, model, parts):
    """Each micro-batch's mean-weighted loss backward, added to the auditor's window; its result."""
    n = sum(p["input_ids"].shape[0] for p in parts)
    with auditor:
        for part in parts:
            w = torch.full((part["input_ids"].shape[0],), 1.0 / n)
            (w * lm_losses(model, part)).sum().backward()
            auditor.add_micro_batch(w)
        return auditor.finish_window()


def window(init_state, parts, **audit) -> dict:
    model = tiny_gpt2()
    model.load_state_dict(init_state)
    ddp = DDP(model)
    r = audit_window(GNQAuditor(ddp, LAM, batch="step", scope="global", **audit), ddp, parts)
    return {"gnq": r.gnq, "kernel": r.kernel, "mode": r.mode, "k": r.k, "seed": r.seed,
            "batch_size": r.batch_size, "micro_batches": r.micro_batches, "sizes": r.sizes,
            "offset": r.offset, "local_size": r.local_size, "local_gnq": r.local_gnq,
            "bytes_sent": r.comm.bytes_sent, "by_kind": dict(r.comm.by_kind)}


def failing_then_fine(init_state, parts, rank: int) -> dict:
    """Rank 1's second micro-batch has a NaN loss: the window fails on every rank (none waits on
    a gather that never comes), and the next window is scored normally."""
    from gnq_core.engine.math.solve import GNQNumericalError

    model = tiny_gpt2()
    model.load_state_dict(init_state)
    ddp = DDP(model)
    raised = []
    with GNQAuditor(ddp, LAM, batch="step", scope="global", mode="exact") as auditor:
        for poisoned in (True, False):
            for i, part in enumerate(parts):
                w = torch.full((part["input_ids"].shape[0],), 0.25)
                nan = float("nan") if poisoned and rank == 1 and i == 1 else 1.0
                (w * lm_losses(ddp, part) * nan).sum().backward()
                auditor.add_micro_batch(w)
            try:
                r = auditor.finish_window()
            except GNQNumericalError as exc:
                raised.append(str(exc))
    return {"raised": raised, "gnq": r.gnq}


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    init = tiny_gpt2().state_dict()
    parts = micro_batches(rank)
    saved = {"init": init, "parts": parts,
             "sketch": window(init, parts, mode="sketch", sketch=SPEC),
             "exact": window(init, parts, mode="exact"),
             "auto": window(init, parts, mode="auto", sketch=SPEC,
                            window_budget=10**12 if rank == 0 else 1_000),
             "nan": failing_then_fine(init, parts, rank)}
    torch.save(saved, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
