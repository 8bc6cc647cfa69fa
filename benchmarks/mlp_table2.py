"""Paper Table 2: naive GNQ (literal P×P, Alg. 2) vs the auditor on the 100-40-10 MLP, B = 32.

    python -m benchmarks.mlp_table2 [--repeats 3]

Time: median of interleaved repeats of the whole GNQ computation for one batch (naive: explicit
per-example gradients + one P×P solve per example; auditor: the hooked forward/backward +
compute()).  Extra peak memory: each variant runs in a fresh subprocess; we report the rise of
its peak resident memory (ru_maxrss) over the same process just before the computation, and the
bytes of the buffers each variant allocates by construction (P×P float64 for naive, B×B for the
auditor).  Inputs are random MNIST-shaped vectors (100 features, 10 classes): no dataset download.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import torch
from torch import nn

from gnq_core import GNQAuditor, exact_gnq
from gnq_core.engine.math.reference import naive_gnq, per_example_gradients_func

from .common import interleaved, write

B, LAM = 32, 1e-3


def setup(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(100, 40), nn.ReLU(), nn.Linear(40, 10))
    x, y = torch.randn(B, 100), torch.randint(0, 10, (B,))
    return model, (x, y)


def losses(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y, reduction="none")


def run_naive(model, batch) -> torch.Tensor:
    G = per_example_gradients_func(model, losses, batch)
    return naive_gnq(G, LAM)


def run_auditor(model, batch) -> torch.Tensor:
    with GNQAuditor(model, lam=LAM, check_uses=False) as auditor:
        losses(model, batch).sum().backward()
        out = auditor.compute().gnq
    model.zero_grad(set_to_none=True)
    return out


def peak_rise_kib(variant: str) -> int:
    """Run one variant in a fresh process; the rise of its resident memory during the computation
    (sampled every 0.5 ms by a thread reading /proc/self/statm) over the level just before."""
    code = f"""
import os, threading, time
from benchmarks.mlp_table2 import setup, run_naive, run_auditor
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
model, batch = setup()
run_auditor(*setup())  # warm up allocator and kernels on a throwaway copy
before, peak, done = rss(), [0], [False]
def sample():
    while not done[0]:
        peak[0] = max(peak[0], rss()); time.sleep(0.0005)
t = threading.Thread(target=sample); t.start()
{'run_naive' if variant == 'naive' else 'run_auditor'}(model, batch)
done[0] = True; t.join()
print(max(0, peak[0] - before) // 1024)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model, batch = setup()
    P = sum(p.numel() for p in model.parameters())
    naive, ghost = run_naive(model, batch), run_auditor(model, batch)
    reference = exact_gnq(model, losses, batch, LAM).gnq
    agreement = {"naive_vs_reference": float(((naive - reference).abs() / reference.abs()).max()),
                 "auditor_vs_reference": float(((ghost - reference).abs() / reference.abs()).max())}
    variants = {"naive": lambda: run_naive(model, batch), "auditor": lambda: run_auditor(model, batch)}
    times = interleaved(variants, repeats=args.repeats)
    rss = {v: peak_rise_kib(v) for v in ("naive", "auditor")}
    buffers = {"naive": 2 * P * P * 8, "auditor": 2 * B * B * 8}  # S_{-j} and its factor; K and L
    result = {
        "model": "MLP 100-40-10", "parameters": P, "batch_size": B, "lam": LAM, "repeats": args.repeats,
        "seconds": {k: v["median_s"] for k, v in times.items()},
        "speedup": times["naive"]["median_s"] / times["auditor"]["median_s"],
        "peak_rss_rise_kib": rss,
        "buffer_bytes": buffers,
        "memory_ratio_buffers": buffers["naive"] / buffers["auditor"],
        "max_rel_error": agreement,
    }
    path = write("mlp_table2", result)
    print(json.dumps({k: result[k] for k in ("seconds", "speedup", "peak_rss_rise_kib", "buffer_bytes",
                                             "max_rel_error")}, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
