"""Where ghost and materialise really cross over, next to where the cost model puts it.

    python -m benchmarks.crossover                      # Linear d×d, B=16, T = 1 … 256

For a Linear layer of width d on a batch of B sequences of length T, time the layer's Gram
block both ways (``grams.inner`` with the path forced; median of interleaved repeats):
ghost — the two (BT)×(BT) factor Grams — and materialise — B per-example d×d gradients
and their Gram.  For each width, report the measured crossover (the smallest T from which
materialising is faster) and the cost model's (``cost_model.choose_path``).
"""

from __future__ import annotations

import argparse

import torch

from gnq_core.engine.math.cost_model import choose_path
from gnq_core.engine.math.grams import inner
from gnq_core.engine.math.representations import DenseFactor, OuterRep

from .common import interleaved, write


def measure(batch: int, length: int, width: int, repeats: int) -> dict:
    g = torch.Generator().manual_seed(batch * 1000 + length + width)
    x = torch.randn(batch, length, width, generator=g)
    d = torch.randn(batch, length, width, generator=g)
    rep = OuterRep(DenseFactor(d), DenseFactor(x), bias=True)
    times = interleaved({"ghost": lambda: inner(rep, rep, "ghost"),
                         "materialize": lambda: inner(rep, rep, "materialize")}, repeats)
    ghost, mat = times["ghost"]["median_s"], times["materialize"]["median_s"]
    return {"batch": batch, "length": length, "width": width, "ghost_s": ghost, "materialize_s": mat,
            "faster": "ghost" if ghost <= mat else "materialize", "model_choice": choose_path(rep, rep)}


def crossover(rows: list[dict], key: str) -> int | None:
    """Smallest T from which every longer T prefers materialising."""
    best = None
    for row in sorted(rows, key=lambda r: -r["length"]):
        if row[key] != "materialize":
            break
        best = row["length"]
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--width", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--length", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    rows, summary = [], []
    for width in args.width:
        these = [measure(args.batch, t, width, args.repeats) for t in args.length]
        rows += these
        agree = sum(r["faster"] == r["model_choice"] for r in these)
        summary.append({"width": width, "measured_crossover_T": crossover(these, "faster"),
                        "model_crossover_T": crossover(these, "model_choice"),
                        "model_agrees": f"{agree}/{len(these)}"})
        for r in these:
            print(f"d={width:5d} T={r['length']:4d}: ghost {r['ghost_s'] * 1e3:9.2f} ms, materialise "
                  f"{r['materialize_s'] * 1e3:9.2f} ms -> {r['faster']:11s} (model: {r['model_choice']})")
        print(summary[-1])
    path = write("crossover", {"batch": args.batch, "rows": rows, "summary": summary})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
