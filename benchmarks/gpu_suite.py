"""Every GPU measurement of issue 17 in one command, JSON in benchmarks/results/ naming the device.

    python -m benchmarks.gpu_suite                 # on a CUDA machine (about 10 minutes on an H100)
    python -m benchmarks.gpu_suite --quick         # a smoke run of the same code (CPU is fine)

In-run (``benchmarks.inrun_overhead.run``: plain vs audited vs audited-fused training steps,
interleaved, median; extra peak memory from ``torch.cuda.max_memory_allocated``):
GPT-2 small B16 T128 in fp32, bf16 autocast and TF32; GPT-2 small B8 T64; GPT-2 medium
B16 T128; a 1B-class Llama shape (16 layers × 2048) B16 T128 in bf16 autocast.
Post hoc: ``gnq audit`` as a command (a fresh process, two checkpoints of a GPT-2-small-shaped
model, AG News texts) — its throughput per checkpoint against a plain forward+backward over
the same batches, and its start-up (command wall time minus the checkpoints' own seconds).
Targets (issue 17): fp32 ≤ 1.10×, bf16 ≤ 1.15×, extra peak memory ≤ 10 %, B8 T64 ≤ 1.25×,
audit throughput ≥ 0.75× the floor, start-up < 5 s.
Issue 28's measures on the device too: aten ops (≈ launches) per training step of the
GPT-2-small structure at a tiny width, B16 T128 (``benchmarks.aten_ops``), and SmolLM2-135M
in-run, B8 T64, fp32 and bf16 (``benchmarks.smollm2_inrun``, when the model folder is here).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from gnq_core.engine.math.losses import per_example_lm_loss
from gnq_core.results.store import Store
from gnq_core.sources.checkpoints.save import save_checkpoint
from gnq_core.sources.models import train_tokenizer
from gnq_core.sources.tokens import batch_partition, collate, encode_texts, pad_id

from . import aten_ops, inrun_overhead, smollm2_inrun
from .cli_throughput import ag_news_texts
from .common import write

ROOT = Path(__file__).resolve().parents[1]
INRUN = [  # preset, batch, length, precision
    ("gpt2-small", 16, 128, "fp32"),
    ("gpt2-small", 16, 128, "bf16"),
    ("gpt2-small", 16, 128, "tf32"),
    ("gpt2-small", 8, 64, "fp32"),
    ("gpt2-medium", 16, 128, "fp32"),
    ("llama-1b", 16, 128, "bf16"),
]
QUICK = [("cpu-small", 2, 16, "fp32"), ("cpu-small", 2, 16, "bf16")]


def corpus(n: int) -> tuple[list[str], str]:
    """n AG News texts when the shared copy is here, else seeded synthetic news-length texts
    (a GPU machine may not have the data; the throughput depends on lengths, not on meaning)."""
    try:
        return ag_news_texts(n), "ag_news"
    except SystemExit:
        gen = torch.Generator().manual_seed(0)
        words = [f"w{i}" for i in range(3000)]
        sizes = torch.randint(25, 70, (n,), generator=gen).tolist()
        picks = torch.randint(0, len(words), (sum(sizes),), generator=gen).tolist()
        texts, at = [], 0
        for k in sizes:
            texts.append(" ".join(words[i] for i in picks[at:at + k]) + ".")
            at += k
        return texts, "synthetic (seeded words, 25-70 per text)"


def audit_throughput(work: Path, n: int, batch: int, length: int, layers: int, width: int,
                     device: str) -> dict:
    """`gnq audit` on two checkpoints vs a plain forward+backward over the same batches."""
    texts, source = corpus(n)
    data = work / "texts.txt"
    data.write_text("\n".join(texts) + "\n", encoding="utf-8")
    tokenizer = train_tokenizer(texts, vocab_size=8192)
    cfg = GPT2Config(vocab_size=len(tokenizer), n_positions=length, n_layer=layers, n_embd=width,
                     n_head=max(width // 64, 1), bos_token_id=0, eos_token_id=0, pad_token_id=0)
    for k in (1, 2):
        torch.manual_seed(k)
        save_checkpoint(GPT2LMHeadModel(cfg), tokenizer, work / "series" / f"epoch-{k}")

    model = GPT2LMHeadModel.from_pretrained(work / "series" / "epoch-1").to(device).eval()
    ids = encode_texts(tokenizer, texts, length)
    batches = [collate([ids[i] for i in part], part, pad_id(tokenizer)).to(torch.device(device))
               for part in batch_partition(len(texts), batch, 0)]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def floor(net: torch.nn.Module, backward: bool) -> float:
        sync()
        start = time.perf_counter()
        for b in batches:
            with torch.set_grad_enabled(backward):
                logits = net(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
                losses = per_example_lm_loss(logits, b.labels)
            if backward:
                losses.sum().backward()
                net.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - start

    floor(model, True)  # warm-up
    forward_s, forward_backward_s = floor(model, False), floor(model, True)
    del model
    db = work / "gnq.duckdb"
    cmd = [sys.executable, "-m", "gnq_core.cli", "audit", "--checkpoints", str(work / "series"),
           "--data", str(data), "--db", str(db), "--name", "bench", "--batch-size", str(batch),
           "--max-length", str(length), "--device", device, "--quiet"]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=os.environ | {"PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - start
    store = Store(db)
    point_s = store.points(store.run("bench").run_id)["seconds"].tolist()
    per_point = sum(point_s) / len(point_s)
    return {"texts": source, "examples": len(texts), "batch": batch, "max_length": length, "layers": layers,
            "width": width, "vocab": len(tokenizer), "checkpoints": len(point_s),
            "floor_forward_s": forward_s, "floor_forward_backward_s": forward_backward_s,
            "audit_point_s": point_s,
            "audit_examples_per_s_per_checkpoint": len(texts) / per_point,
            "throughput_vs_forward_backward": forward_backward_s / per_point,
            "command_wall_s": wall, "startup_s": wall - sum(point_s)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes: check the suite runs")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--examples", type=int, default=2000)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cuda" and not args.quick:
        raise SystemExit("no CUDA device: this suite measures a GPU (use --quick for a smoke run)")
    rows, failures = [], []
    for preset, batch, length, precision in QUICK if args.quick else INRUN:
        try:
            repeats = 3 if args.quick else args.repeats
            row = inrun_overhead.run(preset, batch, length, repeats, device, precision)
        except Exception as exc:  # e.g. out of memory on a smaller GPU: record it, go on
            failures.append({"preset": preset, "batch": batch, "length": length, "precision": precision,
                             "error": f"{type(exc).__name__}: {exc}".splitlines()[0],
                             "trace": traceback.format_exc()[-2000:]})
            print(f"{preset} B{batch} T{length} {precision}: FAILED {failures[-1]['error']}")
            continue
        finally:
            torch.cuda.empty_cache() if device == "cuda" else None
        rows.append(row)
        memory = (f", extra peak memory {row['extra_peak_memory_ratio_fused']:.1%}"
                  if "extra_peak_memory_ratio_fused" in row else "")
        print(f"{preset} B{batch} T{length} {precision}: plain {row['plain_s'] * 1e3:.1f} ms, audited "
              f"{row['overhead_ratio']:.3f}x, fused {row['overhead_ratio_fused']:.3f}x{memory}")
    ops = aten_ops.count(12, 32, 64, 16, 128, device)
    print("aten ops per step: " + ", ".join(f"{k} {v['ops']} ({v['ratio']:.3f}x)"
                                            for k, v in ops["variants"].items()))
    smollm2, smollm2_failures = [], []
    if (smollm2_inrun.MODEL / "config.json").exists():
        batch, length, rounds = (2, 8, 2) if args.quick else (8, 64, 7)
        for precision in ("fp32",) if args.quick else ("fp32", "bf16"):
            try:
                row = smollm2_inrun.run(smollm2_inrun.MODEL, batch, length, rounds, ["default", "unfused"],
                                        device, precision)
            except Exception as exc:  # recorded, like the in-run rows
                error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                smollm2_failures.append({"precision": precision, "error": error})
                continue
            smollm2.append(row)
            print(f"SmolLM2-135M {precision}: audited {row['default_ratio_median']:.3f}x, unfused "
                  f"{row['unfused_ratio_median']:.3f}x")
    with tempfile.TemporaryDirectory(prefix="gnq-gpu-suite-") as tmp:
        shape = dict(n=64, batch=8, length=32, layers=2, width=64) if args.quick else \
            dict(n=args.examples, batch=16, length=128, layers=12, width=768)
        audit = audit_throughput(Path(tmp), device=device, **shape)
    print(f"gnq audit: {audit['audit_examples_per_s_per_checkpoint']:.0f} texts/s per checkpoint, "
          f"{audit['throughput_vs_forward_backward']:.2f}x a plain forward+backward; start-up "
          f"{audit['startup_s']:.1f} s")
    path = write("gpu_suite" + ("-quick" if args.quick else ""),
                 {"inrun": rows, "inrun_failures": failures, "audit": audit, "aten_ops": ops,
                  "smollm2_inrun": smollm2, "smollm2_failures": smollm2_failures})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
