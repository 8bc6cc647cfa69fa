"""Peak RSS of `gnq audit` on Llama-shaped models saved as sharded bf16 safetensors, against the
memory plan (gnq_core.sources.memory_plan) made for the same run before it loads.

    PYTHONPATH=$PWD python -m benchmarks.model_memory --shape mid --batch 4 16 --label after

Each point builds a Llama from config with random weights (seeded), saves ``--checkpoints`` copies
of it (different seeds) as sharded safetensors in bfloat16 with a byte-level BPE tokenizer trained
here on WikiText-2, writes ``--texts`` WikiText-2 passages long enough to fill ``--max-length``
tokens, and runs the real CLI (`python -m gnq_core.cli audit`) as a child on the CPU at one torch
thread; its max RSS comes from ``os.wait4``.  The plan is computed in this process for the same
folder and options (nothing loaded).  Points are merged into
``benchmarks/results/model_memory-cpu.json`` by (label, shape, batch, max_length, dtype).

These runs are the calibration of the plan's terms (docs/performance.md, "Memory"): the plan must
state a peak within [0.67, 1.5]× the measured one, checked here (exit 1 when not).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import RESULTS, machine, write

ROOT = Path(__file__).resolve().parents[1]
WIKI = ROOT.parent / "shared" / "data" / "wikitext2" / "wiki.valid.raw"
if not WIKI.exists():
    WIKI = Path("/work/shared/data/wikitext2/wiki.valid.raw")

# Llama shapes: (hidden, layers, intermediate, heads, kv heads, vocab)
SHAPES = {
    "small": (256, 4, 688, 4, 4, 8192),           # ~8.5M parameters
    "mid": (768, 12, 2048, 12, 12, 32000),        # ~0.13B parameters, untied
    "large": (1024, 16, 2816, 16, 8, 32000),      # ~0.25B parameters, untied
    # Qwen2.5-0.5B's blocks (width 896, 24 layers, MLP 4864, 14 heads / 2 key-value heads), untied,
    # a 50,304-row vocabulary: ~0.45B parameters
    "0.45b": (896, 24, 4864, 14, 2, 50304),
}
BOUNDS = (0.67, 1.5)


def passages(n: int, chars: int) -> list[str]:
    """``n`` WikiText-2 passages of about ``chars`` characters (paragraphs joined)."""
    lines = [line.strip() for line in WIKI.read_text(encoding="utf-8").splitlines()
             if len(line.strip()) > 80 and not line.strip().startswith("=")]
    out, cur = [], ""
    for line in lines:
        cur = f"{cur} {line}".strip()
        if len(cur) >= chars:
            out.append(cur[:chars])
            cur = ""
            if len(out) == n:
                break
    return out


def build(work: Path, shape: str, checkpoints: int) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from gnq_core.sources.models import train_tokenizer

    hidden, layers, inter, heads, kv, vocab = SHAPES[shape]
    tok = train_tokenizer(passages(400, 600), vocab_size=4096)
    config = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                         num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                         max_position_embeddings=1024, tie_word_embeddings=False,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0)
    series = work / f"series-{shape}"
    for i in range(checkpoints):
        torch.manual_seed(i)
        model = LlamaForCausalLM(config).to(torch.bfloat16)
        folder = series / f"checkpoint-{i + 1}"
        model.save_pretrained(folder, max_shard_size="100MB", safe_serialization=True)
        tok.save_pretrained(folder)
        del model
    return series


def measure(series: Path, data: Path, work: Path, batch: int, length: int, dtype: str | None) -> dict:
    db = work / f"audit-{batch}-{length}.duckdb"
    cmd = [sys.executable, "-m", "gnq_core.cli", "audit", "--checkpoints", str(series), "--data", str(data),
           "--db", str(db), "--name", "bench", "--batch-size", str(batch), "--max-length", str(length),
           "--device", "cpu", "--threads", "1", "--quiet"] + (["--dtype", dtype] if dtype else [])
    return run_child(cmd, os.environ | {"PYTHONPATH": str(ROOT)}, work / "audit.log", db)


def run_child(cmd: list[str], env: dict, log: Path, db: Path, on_start=None) -> dict:
    """Run ``cmd`` as a child (output to ``log``), its exit code, wall and CPU seconds and max RSS
    from ``os.wait4``; ``db`` removed afterwards.  ``on_start(proc)``: called once it runs (e.g. a
    memory guard)."""
    start = time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        if on_start is not None:
            on_start(proc)
        _, status, usage = os.wait4(proc.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    text = log.read_text(errors="replace")
    db.unlink(missing_ok=True)
    return {"exit": code, "wall_s": round(wall, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "peak_rss_bytes": usage.ru_maxrss * 1024, "log_tail": text[-600:]}


def plan_for(series: Path, batch: int, length: int, dtype: str | None, checkpoints: int) -> dict:
    from gnq_core.sources.memory_plan import plan_audit

    first = sorted(p for p in series.iterdir() if p.is_dir())[0]
    plan = plan_audit(first, batch_size=batch, max_length=length, dtype=dtype, checkpoints=checkpoints,
                      device="cpu")
    return {"planned_peak_bytes": plan.peak, "prefetch": plan.prefetch,
            "terms": {t.name: t.bytes for t in plan.terms}}


def llama_parameters(hidden: int, layers: int, intermediate: int, heads: int, kv_heads: int,
                     vocab: int) -> int:
    """A Llama's parameters (untied head, no biases), as its safetensors headers count them."""
    kv = hidden // heads * kv_heads
    return 2 * vocab * hidden + layers * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * intermediate
                                          + 2 * hidden) + hidden


def replan(path: Path) -> None:
    """The stored points' plans made again by this code (the measured peaks kept): a change of the
    plan's constants is checked against every measurement at once."""
    from gnq_core.sources.memory_plan import Shape, plan_for_batch

    payload = json.loads(path.read_text())
    for p in payload["points"]:
        if p.get("exit") != 0:
            continue
        d = p["llama"]
        n = llama_parameters(**d)
        shape = Shape(parameters=n, file_bytes=2 * n, stored_dtype="bfloat16", hidden=d["hidden"],
                      layers=d["layers"], intermediate=d["intermediate"],
                      kv_width=d["hidden"] // d["heads"] * d["kv_heads"], heads=d["heads"], vocab=d["vocab"])
        # "before": the code then audited in float32 whatever the checkpoints' dtype
        dtype = p.get("dtype") or ("float32" if p["label"] == "before" else "bfloat16")
        plan = plan_for_batch(shape, batch_size=p["batch"], max_length=p["max_length"], dtype=dtype,
                              checkpoints=p["checkpoints"], device="cpu", room=2**62, room_source="-",
                              prefetch=True)
        p |= {"compute_dtype": dtype, "planned_peak_bytes": plan.peak,
              "terms": {t.name: t.bytes for t in plan.terms},
              "planned_over_measured": round(plan.peak / p["peak_rss_bytes"], 3)}
        print(p["label"], p["shape"], dtype, p["batch"], p["planned_over_measured"])
    path.write_text(json.dumps(payload, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="mid", choices=sorted(SHAPES))
    parser.add_argument("--batch", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--texts", type=int, default=32)
    parser.add_argument("--checkpoints", type=int, default=2)
    parser.add_argument("--dtype", default=None, help="--dtype for gnq audit (default: the audit's)")
    parser.add_argument("--label", default="after")
    parser.add_argument("--no-plan", action="store_true", help="measure only (code without the plan)")
    parser.add_argument("--replan", action="store_true", help="plan the stored points again, measure nothing")
    args = parser.parse_args()
    if args.replan:
        replan(RESULTS / "model_memory-cpu.json")
        return

    path = RESULTS / "model_memory-cpu.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    points = {(p["label"], p["shape"], p["batch"], p["max_length"], p.get("dtype")): p
              for p in old.get("points", [])}
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        series = build(work, args.shape, args.checkpoints)
        data = work / "texts.jsonl"
        data.write_text("".join(json.dumps({"text": t}) + "\n" for t in passages(args.texts, 900)))
        for batch in args.batch:
            point = {"label": args.label, "shape": args.shape, "llama": dict(zip(
                ("hidden", "layers", "intermediate", "heads", "kv_heads", "vocab"), SHAPES[args.shape],
                strict=True)), "batch": batch, "max_length": args.max_length, "texts": args.texts,
                "checkpoints": args.checkpoints, "dtype": args.dtype, "saved_as": "bfloat16, sharded"}
            if not args.no_plan:
                point |= plan_for(series, batch, args.max_length, args.dtype, args.checkpoints)
            point |= measure(series, data, work, batch, args.max_length, args.dtype)
            if "planned_peak_bytes" in point and point["exit"] == 0:
                ratio = point["planned_peak_bytes"] / point["peak_rss_bytes"]
                point["planned_over_measured"] = round(ratio, 3)
                if not BOUNDS[0] <= ratio <= BOUNDS[1]:
                    failed.append(point)
            print(json.dumps({k: v for k, v in point.items() if k != "log_tail"}), flush=True)
            points[(args.label, args.shape, batch, args.max_length, args.dtype)] = point
    write("model_memory", {"what": __doc__.splitlines()[0], "machine": machine(), "bounds": BOUNDS,
                      "points": list(points.values())})
    if failed:
        raise SystemExit(f"{len(failed)} point(s) outside {BOUNDS}x the measured peak")


if __name__ == "__main__":
    main()
