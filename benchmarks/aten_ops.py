"""Aten ops dispatched per training step, plain vs audited: what a GPU launches, counted on a CPU.

    OMP_NUM_THREADS=1 python -m benchmarks.aten_ops            # GPT-2-small structure, B16 T128

A GPT-2 with GPT-2 small's structure (12 blocks, tied head) at a tiny width, so the count is
what the step dispatches, not how long its arithmetic takes: forward, backward, ``compute()``
(the GNQ part) and a foreach AdamW step (a GPU's default), counted by a ``TorchDispatchMode``
on the third step (two warm-up steps first).  Every aten op is counted, views included: on a
GPU a view launches nothing but still costs the host its dispatch.  Variants: plain; audited by
``GNQAuditor``'s default; with ``fused=True``; with ``fused=False`` (autograd's own weight gradients).
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import GPT2Config, GPT2LMHeadModel

from gnq_core import GNQAuditor, per_example_lm_loss
from gnq_core.engine.math import cpu_gram

from .common import write

VIEWS = {"view", "_unsafe_view", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze",
         "slice", "select", "detach", "alias", "as_strided", "reshape", "split", "unbind"}


class OpCounter(TorchDispatchMode):
    """Counts every aten op that reaches the dispatcher's Python mode (one per kernel call)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def count(layers: int, width: int, vocab: int, batch: int, length: int, device: str = "cpu") -> dict:
    # the count stands for a GPU's launches: the CPU-only Gram kernel (engine/math/cpu_gram.py, not an
    # aten op) is off, so each fused layer's Gram is one addmm_ here as it is on a GPU
    saved, cpu_gram.MAX_THREADS = cpu_gram.MAX_THREADS, -1
    try:
        return _count(layers, width, vocab, batch, length, device)
    finally:
        cpu_gram.MAX_THREADS = saved


def _count(layers: int, width: int, vocab: int, batch: int, length: int, device: str) -> dict:
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=layers, n_embd=width, n_head=2, vocab_size=vocab, n_positions=length,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    ids = torch.randint(0, vocab, (batch, length), device=device)
    weights = torch.full((batch,), 1.0 / batch, device=device)

    def step(auditor: GNQAuditor | None) -> None:
        per_example_lm_loss(model(input_ids=ids).logits, ids).mean().backward()
        if auditor is not None:
            auditor.compute(weights=weights)
        opt.step()
        opt.zero_grad(set_to_none=True)

    rows = {}
    for name, kwargs in (("plain", None), ("audited_default", {}), ("audited_fused", {"fused": True}),
                         ("audited_unfused", {"fused": False})):
        auditor = None if kwargs is None else GNQAuditor(model, lam=1e-2, **kwargs)
        try:
            step(auditor)
            step(auditor)
            with OpCounter() as counter:
                step(auditor)
            paths = None
            if auditor is not None:
                with OpCounter():  # one more step only to read which paths it took
                    per_example_lm_loss(model(input_ids=ids).logits, ids).mean().backward()
                    paths = sorted({p for e in auditor.compute(weights=weights).coverage.entries
                                    for p in e.paths})
                    model.zero_grad(set_to_none=True)
        finally:
            if auditor is not None:
                auditor.close()
        ops = counter.ops
        total = sum(ops.values())
        views = sum(v for k, v in ops.items() if k in VIEWS)
        rows[name] = {"ops": total, "non_view_ops": total - views, "paths": paths,
                      "by_op": dict(ops.most_common())}
    plain = rows["plain"]
    for row in rows.values():
        row["ratio"] = row["ops"] / plain["ops"]
        row["non_view_ratio"] = row["non_view_ops"] / plain["non_view_ops"]
    return {"layers": layers, "width": width, "vocab": vocab, "batch": batch, "length": length,
            "device": device, "optimizer": "AdamW(foreach=True)", "variants": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--tag", default="", help="suffix of the results file (e.g. 'before')")
    args = ap.parse_args()
    row = count(args.layers, args.width, args.vocab, args.batch, args.length)
    for name, v in row["variants"].items():
        print(f"{name}: {v['ops']} ops ({v['ratio']:.3f}x), {v['non_view_ops']} without views "
              f"({v['non_view_ratio']:.3f}x); paths {v['paths']}")
    path = write("aten_ops" + (f"-{args.tag}" if args.tag else ""), {"rows": [row]})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
