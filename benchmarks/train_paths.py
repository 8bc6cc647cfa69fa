"""`gnq train` epoch time with the fused weight gradient (the default) against autograd's own.

    python -m benchmarks.train_paths            # preset small, 256 AG News texts, B16 T128

Runs ``run_training`` (what `gnq train` runs: tokenising, the store writes and checkpoints are
in the time) for one epoch per variant, alternating, into fresh DuckDB stores, and reports the
median epoch seconds and the fused / unfused ratio.  Both variants compute exact in-run GNQ.
One torch thread and this process's CPU seconds (``time.process_time``): steady on a shared
machine, where wall time measures the neighbours.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from gnq_core.engine.auditor import GNQAuditor
from gnq_core.pipelines import train as train_module
from gnq_core.pipelines.settings import TrainSettings
from gnq_core.results.store import Store
from gnq_core.sources.datasets import load_texts

from .cli_throughput import ag_news_texts
from .common import interleaved_timed, write


def _unfused(model, lam, fused):
    return GNQAuditor(model, lam=lam, fused=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    settings = TrainSettings(batch_size=args.batch, max_length=args.length, epochs=1, preset=args.preset)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "texts.csv"
        pd.DataFrame({"text": ag_news_texts(args.texts)}).to_csv(data, index=False)
        dataset = load_texts(data, "text")
        counter = iter(range(10**6))

        def epoch(fused: bool) -> float:
            i = next(counter)
            original = train_module.GNQAuditor
            if not fused:
                train_module.GNQAuditor = functools.partial(_unfused)
            try:
                store = Store(Path(tmp) / f"{i}.duckdb")
                t0 = time.process_time()
                train_module.run_training(store, dataset, Path(tmp) / f"run-{i}", name=f"run-{i}",
                                          settings=settings)
                return time.process_time() - t0
            finally:
                train_module.GNQAuditor = original

        timed = interleaved_timed({"fused": lambda: epoch(True), "unfused": lambda: epoch(False)},
                                  args.repeats)
    row = {"preset": args.preset, "texts": args.texts, "batch": args.batch, "length": args.length,
           "repeats": args.repeats, "clock": "process_time", "epoch_fused_s": timed["fused"]["median_s"],
           "epoch_unfused_s": timed["unfused"]["median_s"],
           "fused_over_unfused": timed["fused"]["median_s"] / timed["unfused"]["median_s"],
           "all_s": {k: v["all_s"] for k, v in timed.items()}}
    print(row)
    print(write("train_paths", {"rows": [row]}))


if __name__ == "__main__":
    main()
