"""In-run GNQ on a real model on CPU: SmolLM2-135M training steps, plain vs audited, interleaved.

    OMP_NUM_THREADS=1 python -m benchmarks.smollm2_inrun             # B8 T64, 5 rounds

Exits 1, after writing the results, when a variant's per-round ratio median is over its
``--max-ratio`` (default ``default=1.10``, the per-micro-batch step's target): a regression of
the default auditor's step fails loudly instead of sitting in a results file.

The lead's local copy of SmolLM2-135M-Instruct (Llama, 30 layers, tied 49,152-row embedding;
``/root/.cache/gnq-audit/models/smollm2-135m-instruct``, or ``--model``).  One torch thread;
each round runs a plain step, then an audited one (``GNQAuditor``'s default; ``--variants``
adds others), on the same batch of random token ids; a step is forward, backward, ``compute()``
and an SGD update.  The auditor stays attached and is paused for the plain steps.  Median of
this process's CPU seconds per step (``time.process_time``: one thread, so it is the step's own
work and does not count the time the neighbours' processes hold the core) and the median of the
per-round ratios; the load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from pathlib import Path

import torch

from gnq_core import GNQAuditor, per_example_lm_loss

from .common import check_ratios, exit_on_failure, ratio_limits, write

MODEL = Path("/root/.cache/gnq-audit/models/smollm2-135m-instruct")
VARIANTS = {"default": {}, "fused": {"fused": True}, "unfused": {"fused": False}}


def run(model_dir: Path, batch: int, length: int, rounds: int, variants: list[str], device: str = "cpu",
        precision: str = "fp32") -> dict:
    """On CUDA: wall seconds with the device synchronised; ``precision`` \"bf16\": autocast."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: every round sees the same weights
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (batch, length), device=device)
    weights = torch.full((batch,), 1.0 / batch, device=device)
    cuda = device == "cuda"
    clock = time.perf_counter if cuda else time.process_time
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16")
    auditors = {v: GNQAuditor(model, lam=1e-2, **VARIANTS[v]) for v in variants}

    def step(active: str | None) -> float:
        with contextlib.ExitStack() as stack:
            for name, a in auditors.items():
                if name != active:
                    stack.enter_context(a.paused())
            sync()
            start = clock()
            with autocast:
                losses = per_example_lm_loss(model(input_ids=ids).logits, ids)
            losses.mean().backward()
            if active is not None:
                auditors[active].compute(weights=weights)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            return clock() - start

    load_before = os.getloadavg()
    for v in [None, *variants]:  # warm-up (the first audited step also probes the model)
        step(v)
    times: dict[str, list[float]] = {k: [] for k in ["plain", *variants]}
    for _ in range(rounds):
        times["plain"].append(step(None))
        for v in variants:
            times[v].append(step(v))
    load_after = os.getloadavg()
    paths = {}
    for v, a in auditors.items():
        with contextlib.ExitStack() as stack:
            for name, other in auditors.items():
                if name != v:
                    stack.enter_context(other.paused())
            per_example_lm_loss(model(input_ids=ids).logits, ids).mean().backward()
            res = a.compute(weights=weights)
            model.zero_grad(set_to_none=True)
        paths[v] = sorted({f"{e.module_type}:{p}" for e in res.coverage.entries for p in e.paths})
        a.close()
    out = {"model": str(model_dir), "parameters": sum(p.numel() for p in model.parameters()),
           "batch": batch, "length": length, "rounds": rounds, "device": device, "precision": precision,
           "clock": "perf_counter" if cuda else "process_time",
           "load_average_before": load_before, "load_average_after": load_after,
           "plain_s": statistics.median(times["plain"]), "all_s": times, "paths": paths}
    for v in variants:
        ratios = [a / p for a, p in zip(times[v], times["plain"], strict=True)]
        out[f"{v}_s"] = statistics.median(times[v])
        out[f"{v}_ratio_of_medians"] = out[f"{v}_s"] / out["plain_s"]
        out[f"{v}_ratio_median"] = statistics.median(ratios)
        out[f"{v}_ratio_range"] = [min(ratios), max(ratios)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=["default"])
    ap.add_argument("--tag", default="", help="suffix of the results file (e.g. 'before')")
    ap.add_argument("--max-ratio", nargs="*", default=["default=1.10"], metavar="VARIANT=LIMIT",
                    help="fail (exit 1) when a variant's per-round ratio median exceeds LIMIT")
    args = ap.parse_args()
    limits = ratio_limits(args.max_ratio)
    if not (args.model / "config.json").exists():
        raise SystemExit(f"{args.model}: no model there (config.json missing)")
    row = run(args.model, args.batch, args.length, args.rounds, args.variants)
    for v in args.variants:
        print(f"{v}: plain {row['plain_s']:.2f} s, audited {row[f'{v}_s']:.2f} s, per-round ratio median "
              f"{row[f'{v}_ratio_median']:.3f} (range {row[f'{v}_ratio_range'][0]:.3f}-"
              f"{row[f'{v}_ratio_range'][1]:.3f})")
    print(f"load average before {row['load_average_before']}, after {row['load_average_after']}")
    verdict = check_ratios({v: row[f"{v}_ratio_median"] for v in args.variants}, limits)
    path = write("smollm2_inrun" + (f"-{args.tag}" if args.tag else ""), {"rows": [row], "verdict": verdict})
    print(f"wrote {path}")
    exit_on_failure(verdict, path)


if __name__ == "__main__":
    main()
