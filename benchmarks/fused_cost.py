"""What the fused path costs per per-example gradient element, next to ghost, on real layer shapes.

    OMP_NUM_THREADS=1 python -m benchmarks.fused_cost            # B8 T64, one thread

For each Linear shape (SmolLM2-135M's block layers and its 49,152-row tied head, GPT-2 small's),
one layer's forward + backward is timed three ways, interleaved: plain (autograd), fused
(``FusedLinearFunction``: per-example gradients in cache-sized chunks, their sum as the weight
gradient, their Gram into the accumulator) and ghost (plain + the ghost Gram of its factors).
The fused path's extra time per element of the B per-example gradients is converted to FLOPs of
the layer's own plain step (6·B·T·d_in·d_out FLOPs in ``plain_s``): that is what the cost model
charges per element (``cost_model.fused_flops``: 2B for the Gram plus ``FUSED_ELEMENT_FLOPS``).
Also the Gram of one 2 MiB chunk: one product, its upper block triangle as two, and the numba
kernel (``engine/math/cpu_gram.py``) that the fused path uses on CPU.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from gnq_core.engine.math.cost_model import fused_is_cheaper
from gnq_core.engine.math.cpu_gram import upper_gram_
from gnq_core.engine.kernels.fused import FusedLinearFunction
from gnq_core.engine.math.grams import ghost_inner
from gnq_core.engine.math.representations import DenseFactor, OuterRep

from .common import interleaved, write

SHAPES = {"smollm2 gate/up": (1536, 576), "smollm2 down": (576, 1536), "smollm2 q/o": (576, 576),
          "smollm2 k/v": (192, 576), "smollm2 tied head": (49152, 576), "gpt2 c_fc": (3072, 768),
          "gpt2 c_proj (mlp)": (768, 3072), "gpt2 c_attn": (2304, 768)}


class _Sink:
    """The auditor's side of a fused call, reduced to what a lone layer needs."""

    def __init__(self, batch: int):
        self.acc = {}
        self.batch = batch
        self.buffer: torch.Tensor | None = None

    def plan(self):
        return "gram", None

    def accumulator(self, dtype, device, upper=False):
        return self.acc.setdefault(upper, torch.zeros(self.batch, self.batch, dtype=dtype, device=device))

    def accept_gram(self, narrow, rows_grad):
        pass

    def workspace(self, numel, dtype, device):
        if self.buffer is None or self.buffer.numel() < numel:
            self.buffer = torch.empty(numel, dtype=dtype, device=device)
        return self.buffer[:numel]


def layer(batch: int, length: int, rows: int, cols: int, repeats: int) -> dict:
    g = torch.Generator().manual_seed(rows * 7 + cols)
    x = torch.randn(batch, length, cols, generator=g, requires_grad=True)
    w = torch.randn(rows, cols, generator=g, requires_grad=True)
    dy = torch.randn(batch, length, rows, generator=g)
    sink = _Sink(batch)

    def plain():
        torch.nn.functional.linear(x, w).backward(dy)
        x.grad = w.grad = None

    def fused():
        FusedLinearFunction.apply(x, w, None, False, sink, 256 * 2**20).backward(dy)
        x.grad = w.grad = None

    def ghost():
        plain()
        rep = OuterRep(DenseFactor(dy), DenseFactor(x.detach()))
        ghost_inner(rep, rep)

    for fn in (plain, fused, ghost):
        fn()
    t = interleaved({"plain": plain, "fused": fused, "ghost": ghost}, repeats)
    plain_s, fused_s, ghost_s = (t[k]["median_s"] for k in ("plain", "fused", "ghost"))
    rate = 6.0 * batch * length * rows * cols / plain_s  # this layer's plain FLOP/s
    elements = batch * rows * cols
    per_element = (fused_s - plain_s) * rate / elements
    return {"rows": rows, "cols": cols, "plain_s": plain_s, "fused_s": fused_s, "ghost_s": ghost_s,
            "fused_extra_ratio": fused_s / plain_s, "ghost_extra_ratio": ghost_s / plain_s,
            "plain_gflops": rate / 1e9, "fused_extra_flops_per_element": per_element,
            "beyond_gram_flops_per_element": per_element - 2.0 * batch,
            "model_choice": "fused" if fused_is_cheaper(batch, length, rows, cols) else "ghost",
            "faster": "fused" if fused_s <= ghost_s else "ghost"}


def chunk_gram(batch: int, repeats: int) -> dict:
    flat = torch.randn(batch, 2 * 2**20 // 4 // batch)
    acc = torch.zeros(batch, batch)
    half = batch // 2

    def whole():
        for _ in range(20):
            acc.addmm_(flat, flat.t())

    def upper():
        for _ in range(20):
            acc[:half].addmm_(flat[:half], flat.t())
            acc[half:, half:].addmm_(flat[half:], flat[half:].t())

    def kernel():
        for _ in range(20):
            upper_gram_(acc, flat)

    variants = {"whole": whole, "upper": upper}
    if upper_gram_(acc, flat):  # numba there, and at most cpu_gram.MAX_THREADS threads
        variants["kernel"] = kernel
    t = interleaved(variants, repeats)
    return {"batch": batch, "n": flat.shape[1], **{f"{k}_us": t[k]["median_s"] / 20 * 1e6 for k in variants}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name, (r, c) in SHAPES.items():
        row = {"layer": name, **layer(args.batch, args.length, r, c, args.repeats)}
        rows.append(row)
        print(f"{name:20s} {r:>6}×{c:<5} plain {row['plain_s'] * 1e3:7.1f} ms"
              f"  fused ×{row['fused_extra_ratio']:.3f}  ghost ×{row['ghost_extra_ratio']:.3f}"
              f"  fused extra {row['fused_extra_flops_per_element']:.0f} FLOP/element"
              f"  model {row['model_choice']}, faster {row['faster']}")
    beyond = statistics.median(r["beyond_gram_flops_per_element"] for r in rows)
    grams = [chunk_gram(b, args.repeats) for b in (4, 8, 16)]
    for gr in grams:
        kernel_us = gr.get("kernel_us", float("nan"))
        print(f"Gram of a 2 MiB chunk in cache, B={gr['batch']}: one product {gr['whole_us']:.0f} µs,"
              f" upper triangle as two {gr['upper_us']:.0f} µs, numba kernel {kernel_us:.0f} µs")
    print(f"median extra beyond the Gram's 2B: {beyond:.0f} FLOP-equivalents per element")
    path = write("fused_cost", {"batch": args.batch, "length": args.length, "threads": args.threads,
                                "rows": rows, "median_beyond_gram_flops_per_element": beyond,
                                "chunk_gram": grams})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
