"""In-run GNQ per optimizer step: an accumulation window of micro-batches, against the plain step.

    python -m benchmarks.window_inrun          # CPU shape cpu-small (4 layers, width 256, vocab 8192)

One optimizer step = ``accumulation`` micro-batches of ``batch`` texts (B_eff = batch ×
accumulation).  Variants, interleaved, medians of the repeats, one thread, in this process's
CPU seconds (``time.process_time``: a shared machine's load shifts wall time by 2x):
* ``plain``: forward/backward of each micro-batch, then the step (no GNQ);
* ``micro``: GNQAuditor on each micro-batch (fused; the per-micro-batch mode);
* ``window_sketch``: WindowAuditor(mode="sketch"), the default SketchSpec, one GNQ over B_eff;
* ``window_exact``: WindowAuditor(mode="exact"), kept factors and cross-micro-batch Grams.
Also reported: the bytes each window variant holds at the end of the window.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch

from gnq_core import GNQAuditor, per_example_lm_loss
from gnq_core.engine.sketch import SketchSpec
from gnq_core.engine.window import WindowAuditor

from .common import interleaved_timed, write
from .inrun_overhead import PRESETS, build


def run(preset: str, batch: int, accumulation: int, length: int, repeats: int, budget: int) -> dict:
    torch.manual_seed(0)
    model = build(preset, length).train()
    vocab = model.config.vocab_size
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    micro = [torch.randint(0, vocab, (batch, length)) for _ in range(accumulation)]
    B_eff = batch * accumulation
    w = torch.full((batch,), 1.0 / B_eff)
    held: dict[str, int] = {}

    # one auditor per variant for the whole run (a training run keeps its auditor: the sketch's
    # projections are drawn once), the others paused during a variant's step
    auditors = {kind: WindowAuditor(model, 1e-2, mode=kind.removeprefix("window_"), sketch=SketchSpec(),
                                    window_budget=budget, check_uses=False)
                for kind in ("window_sketch", "window_exact")}
    auditors["micro"] = GNQAuditor(model, lam=1e-2, check_uses=False)  # fused: installed last

    def step(kind: str) -> float:
        auditor = auditors.get(kind)
        with contextlib.ExitStack() as stack:
            for other, a in auditors.items():
                if other != kind:
                    stack.enter_context(a.paused())
            start = time.process_time()  # this process's CPU seconds: steadier on a shared machine
            for ids in micro:
                losses = per_example_lm_loss(model(input_ids=ids).logits, ids)
                (w * losses).sum().backward()
                if kind == "micro":
                    auditor.compute(weights=w)
                elif auditor is not None:
                    auditor.add_micro_batch(w)
            if isinstance(auditor, WindowAuditor):
                held[kind] = auditor.held_bytes()
                auditor.finish_window()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return time.process_time() - start

    variants = {k: (lambda k=k: step(k)) for k in ("plain", "micro", "window_sketch", "window_exact")}
    for fn in variants.values():  # warm-up
        fn()
    res = interleaved_timed(variants, repeats)
    for a in auditors.values():
        a.close()
    plain = res["plain"]["median_s"]
    return {"preset": preset, "batch": batch, "accumulation": accumulation, "b_eff": B_eff, "length": length,
            "repeats": repeats, "sketch": SketchSpec().describe(), "window_budget": budget,
            **{f"{k}_s": v["median_s"] for k, v in res.items()},
            **{f"{k}_ratio": v["median_s"] / plain for k, v in res.items() if k != "plain"},
            "held_bytes": held, "held_bytes_per_text": {k: v / B_eff for k, v in held.items()},
            "all_s": {k: v["all_s"] for k, v in res.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu-small")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--accumulation", type=int, default=8)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=int, default=4 << 30, help="exact window's budget in bytes")
    args = ap.parse_args()
    torch.set_num_threads(1)
    row = run(args.preset, args.batch, args.accumulation, args.length, args.repeats, args.budget)
    print({k: v for k, v in row.items() if k != "all_s"})
    print(write(f"window_inrun-{args.preset}", {"threads": 1, "rows": [row]}))


if __name__ == "__main__":
    main()
