"""In-run GNQ per optimizer step: an accumulation window of micro-batches, against the plain step.

    python -m benchmarks.window_inrun          # CPU shape cpu-small (4 layers, width 256, vocab 8192)
    python -m benchmarks.window_inrun --preset smollm2-135m --variants plain window_sketch

One optimizer step = ``accumulation`` micro-batches of ``batch`` texts (B_eff = batch ×
accumulation).  Variants, interleaved, medians of the repeats, one thread, in this process's
CPU seconds (``time.process_time``: a shared machine's load shifts wall time by 2x):
* ``plain``: forward/backward of each micro-batch, then the step (no GNQ);
* ``micro``: GNQAuditor on each micro-batch (fused; the per-micro-batch mode);
* ``window_sketch``: WindowAuditor(mode="sketch"), the default SketchSpec, one GNQ over B_eff;
* ``window_exact``: WindowAuditor(mode="exact"), kept factors and cross-micro-batch Grams.
Also reported: the bytes each window variant holds at the end of the window, per text, and at
B_eff = 1,024 (the sketch holds one [B, total] vector per micro-batch: bytes per text × 1,024),
and the load average before and after.  Exits 1, after writing the results, when a variant's
per-round ratio median is over its ``--max-ratio`` (default: the sketched window at most 1.25x
a plain step on cpu-small, 1.15x on smollm2-135m).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

import torch

from gnq_core import GNQAuditor, per_example_lm_loss
from gnq_core.engine.sketch.projection import SketchSpec
from gnq_core.engine.passes.window import WindowAuditor

from .common import check_ratios, exit_on_failure, interleaved_timed, ratio_limits, write
from .inrun_overhead import PRESETS, build

VARIANTS = ("plain", "micro", "window_sketch", "window_exact")
# the targets a step must meet (per-round ratio median vs the plain step)
LIMITS = {"cpu-small": ["window_sketch=1.25"], "smollm2-135m": ["window_sketch=1.15"]}


def run(preset: str, batch: int, accumulation: int, length: int, repeats: int, budget: int,
        variants: tuple[str, ...] = VARIANTS) -> dict:
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
                for kind in ("window_sketch", "window_exact") if kind in variants}
    if "micro" in variants:
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

    kinds = dict.fromkeys(["plain", *(v for v in variants if v in auditors)])
    fns = {k: (lambda k=k: step(k)) for k in kinds}
    load_before = os.getloadavg()
    for fn in fns.values():  # warm-up
        fn()
    res = interleaved_timed(fns, repeats)
    load_after = os.getloadavg()
    sketcher = auditors["window_sketch"].sketcher if "window_sketch" in auditors else None
    for a in auditors.values():
        a.close()
    plain = res["plain"]["median_s"]
    return {"preset": preset, "batch": batch, "accumulation": accumulation, "b_eff": B_eff, "length": length,
            "repeats": repeats, "sketch": SketchSpec().describe(), "window_budget": budget,
            "weight_matrices": None if sketcher is None else sketcher.matrices,
            "blocks_per_matrix": None if sketcher is None else SketchSpec().blocks(sketcher.matrices),
            "load_average_before": load_before, "load_average_after": load_after,
            **{f"{k}_s": v["median_s"] for k, v in res.items()},
            **{f"{k}_ratio": v["median_s"] / plain for k, v in res.items() if k != "plain"},
            **{f"{k}_ratio_per_round_median": statistics.median(
                a / p for a, p in zip(v["all_s"], res["plain"]["all_s"], strict=True))
               for k, v in res.items() if k != "plain"},
            "held_bytes": held, "held_bytes_per_text": {k: v / B_eff for k, v in held.items()},
            "held_bytes_at_b_eff_1024": {k: v / B_eff * 1024 for k, v in held.items()},
            "all_s": {k: v["all_s"] for k, v in res.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu-small")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--accumulation", type=int, default=8)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=int, default=4 << 30, help="exact window's budget in bytes")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--tag", default="", help="suffix of the results file")
    ap.add_argument("--max-ratio", nargs="*", default=None, metavar="VARIANT=LIMIT",
                    help="fail (exit 1) when a measured variant's per-round ratio median exceeds LIMIT")
    args = ap.parse_args()
    wanted = LIMITS.get(args.preset, []) if args.max_ratio is None else args.max_ratio
    limits = {v: x for v, x in ratio_limits(wanted).items() if v in args.variants}
    torch.set_num_threads(1)
    row = run(args.preset, args.batch, args.accumulation, args.length, args.repeats, args.budget,
              tuple(args.variants))
    print({k: v for k, v in row.items() if k != "all_s"})
    name = f"window_inrun-{args.preset}" + (f"-{args.tag}" if args.tag else "")
    verdict = check_ratios({v: row[f"{v}_ratio_per_round_median"] for v in args.variants if v != "plain"},
                           limits)
    path = write(name, {"threads": 1, "rows": [row], "verdict": verdict})
    print(path)
    exit_on_failure(verdict, path)


if __name__ == "__main__":
    main()
