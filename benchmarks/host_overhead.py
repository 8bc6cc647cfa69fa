"""Host overhead of the in-run auditor per covered module (µs), trackable on a CPU-only machine.

    OMP_NUM_THREADS=1 python -m benchmarks.host_overhead

A GPT-2-shaped model so small (width 32, B=2, T=8) that its arithmetic is negligible: what
remains of an audited step over a plain one is the auditor's Python and op-dispatch work per
module — the cost that, on a GPU, decides whether the backward is bound by the host.  Plain,
audited and audited-fused steps interleaved, median of this process's CPU time per step (at one
thread, steadier than wall time on a shared machine); overhead per covered module call.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from gnq_core import GNQAuditor, per_example_lm_loss

from .common import interleaved, write


def _module_calls(model: torch.nn.Module, ids: torch.Tensor) -> int:
    """How many module calls one audited step covers."""
    with GNQAuditor(model, lam=1e-2, check_uses=False) as probe:
        per_example_lm_loss(model(input_ids=ids).logits, ids).sum().backward()
        calls = sum(e.calls for e in probe.compute().coverage.entries)
    model.zero_grad(set_to_none=True)
    return calls


def run(layers: int, width: int, batch: int, length: int, repeats: int) -> dict:
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=layers, n_embd=width, n_head=2, vocab_size=64, n_positions=length,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg).train()
    ids = torch.randint(0, cfg.vocab_size, (batch, length))
    weights = torch.full((batch,), 1.0 / batch)
    calls = _module_calls(model, ids)
    # fused: every Linear/Conv1D fused, as the cost model picks on GPT-2 small at B16 T128 (at this
    # tiny width it would pick the ghost path, which is what the unfused variant measures)
    auditors = {False: GNQAuditor(model, lam=1e-2, fused=False, check_uses=False),
                True: GNQAuditor(model, lam=1e-2, fused=True, path="materialize", check_uses=False)}

    def step(fused: bool | None):
        """One step with only ``fused``'s auditor active (both stay attached, the other paused)."""
        def fn() -> None:
            with contextlib.ExitStack() as stack:
                for key, other in auditors.items():
                    if key is not fused:
                        stack.enter_context(other.paused())
                out = model(input_ids=ids)
                per_example_lm_loss(out.logits, ids).mean().backward()
                if fused is not None:
                    auditors[fused].compute(weights=weights)
            model.zero_grad(set_to_none=True)
        return fn

    variants = {"plain": step(None), "audited": step(False), "audited_fused": step(True)}
    for fn in variants.values():
        fn()
    res = interleaved(variants, repeats, clock=time.process_time)  # CPU time: steadier when shared
    for a in auditors.values():
        a.close()
    plain = res["plain"]["median_s"]
    per = {k: (res[k]["median_s"] - plain) / calls * 1e6 for k in ("audited", "audited_fused")}
    return {"layers": layers, "width": width, "batch": batch, "length": length, "repeats": repeats,
            "module_calls": calls, "clock": "process_time",
            **{f"{k}_s": v["median_s"] for k, v in res.items()},
            "host_us_per_module": per["audited"], "host_us_per_module_fused": per["audited_fused"],
            "all_s": {k: v["all_s"] for k, v in res.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--length", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=31)
    ap.add_argument("--tag", default="", help="suffix of the results file (e.g. 'before')")
    args = ap.parse_args()
    row = run(args.layers, args.width, args.batch, args.length, args.repeats)
    print(f"{row['module_calls']} audited module calls per step: plain {row['plain_s'] * 1e3:.2f} ms, "
          f"audited {row['audited_s'] * 1e3:.2f} ms ({row['host_us_per_module']:.0f} µs/module), "
          f"fused {row['audited_fused_s'] * 1e3:.2f} ms ({row['host_us_per_module_fused']:.0f} µs/module)")
    path = write("host_overhead" + (f"-{args.tag}" if args.tag else ""), {"rows": [row]})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
