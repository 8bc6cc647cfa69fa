"""Peak RSS of `gnq audit --base-model` of PEFT LoRA adapter checkpoints of SmolLM2-135M-Instruct,
against the memory plan (gnq_core.sources.memory_plan) made for the same run before it loads.

    PYTHONPATH=$PWD python -m benchmarks.adapter_memory --batch 2 4 8 --label after

The adapters are what TRL's SFTTrainer + LoRA writes (benchmarks/chat_flow.py's recipe: r 16,
alpha 32, dropout 0.05 on every projection, q k v o gate up down): ``--checkpoints`` folders
``checkpoint-N/`` with ``adapter_config.json`` and ``adapter_model.safetensors`` saved by PEFT,
their A and B drawn at random (seeded per checkpoint; B is zero at PEFT's init, which would make
the adapter a no-op).  The texts are WikiText-2 passages long enough to fill ``--max-length``
tokens.  The real CLI (`python -m gnq_core.cli audit`) runs as a child on the CPU at one torch
thread; its max RSS comes from ``os.wait4``.  ``--mode base`` audits the base model itself as a
full checkpoint (the same texts and options), for comparison.  The plan is computed in this
process for the same folders and options (nothing loaded).  Points are merged into
``benchmarks/results/adapter_memory-cpu.json`` by (label, mode, batch, max_length).

These runs are the calibration of the plan's adapter terms (docs/performance.md, "Memory"): the
plan must state a peak within [0.67, 1.5]× the measured one, checked here (exit 1 when not).
``--replan`` plans the stored points again with this code (the measured peaks kept); ``--where``
counts, in this process, what the first batch's probe keeps by module class for the adapter and
for its base (the term the plan was missing), into the same file.  A run whose RSS passes
``--cap-gb`` is killed (this machine's memory is shared with other jobs): batch 8 was measured at
T 64, since at T 128 it needs about 13 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import RESULTS, machine, write
from benchmarks.model_memory import BOUNDS, passages, run_child

ROOT = Path(__file__).resolve().parents[1]
MODEL = Path.home() / ".cache" / "gnq-audit" / "models" / "smollm2-135m-instruct"
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
RESULT = RESULTS / "adapter_memory-cpu.json"


def build(work: Path, base: Path, checkpoints: int) -> Path:
    """``checkpoints`` LoRA adapters of ``base`` saved by PEFT as a Trainer's checkpoints."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    series = work / "adapters"
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **LORA))
    for i in range(checkpoints):
        gen = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        peft_model.save_pretrained(series / f"checkpoint-{i + 1}", safe_serialization=True)
    return series


def measure(series: Path, base: Path, data: Path, work: Path, batch: int, length: int, mode: str,
            cap: int) -> dict:
    db = work / f"audit-{mode}-{batch}-{length}.duckdb"
    target = ["--checkpoints", str(series), "--base-model", str(base)] if mode == "adapter" else [
        "--checkpoints", str(series)]
    cmd = [sys.executable, "-m", "gnq_core.cli", "audit", *target, "--data", str(data), "--db", str(db),
           "--name", "bench", "--batch-size", str(batch), "--max-length", str(length), "--device", "cpu",
           "--threads", "1", "--quiet"]
    env = os.environ | {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    over = threading.Event()

    def guard(proc) -> None:
        threading.Thread(target=_guard, args=(proc, cap, over), daemon=True).start()

    result = run_child(cmd, env, work / "audit.log", db, on_start=guard)
    return result | ({"killed_over_cap_bytes": cap} if over.is_set() else {})


def _wait_for_room(need: int, minutes: float = 20) -> None:
    """Start a run only while the machine has its planned peak free and 1 GB more (its other jobs'
    memory comes and goes); past ``minutes`` the run starts anyway and the audit's own plan decides."""
    import psutil

    deadline = time.monotonic() + 60 * minutes
    while psutil.virtual_memory().available < need + 10**9 and time.monotonic() < deadline:
        time.sleep(10)


def _guard(proc: subprocess.Popen, cap: int, over: threading.Event) -> None:
    """Kill the audit once its RSS passes ``cap``: on a machine shared with other jobs a run the
    plan under-counts must not take their memory (the point is then recorded as killed)."""
    import psutil

    try:  # never proc.poll(): it would reap the child before os.wait4 reads its usage
        child = psutil.Process(proc.pid)
        while child.status() != psutil.STATUS_ZOMBIE:
            if child.memory_info().rss > cap:
                over.set()
                proc.kill()
                return
            time.sleep(0.05)
    except psutil.NoSuchProcess:  # a zombie's memory_info raises it too
        return


def plan_for(series: Path, base: Path, batch: int, length: int, checkpoints: int, mode: str) -> dict:
    """The plan the audit makes for this run, and the one the code before the adapter terms made
    (an adapter's base planned as a full model)."""
    from gnq_core.sources.memory_plan import plan_audit

    first = sorted(p for p in series.iterdir() if p.is_dir())[0]
    model = base if mode == "adapter" else first
    plan = plan_audit(model, batch_size=batch, max_length=length, dtype=None, checkpoints=checkpoints,
                      device="cpu", adapter=first if mode == "adapter" else None)
    plain = plan_audit(model, batch_size=batch, max_length=length, dtype=None, checkpoints=checkpoints,
                       device="cpu")
    return {"planned_peak_bytes": plan.peak, "planned_as_a_full_model_bytes": plain.peak,
            "prefetch": plan.prefetch, "terms": {t.name: t.bytes for t in plan.terms}}


def replan(path: Path, base: Path) -> None:
    """The stored points' plans made again by this code (the measured peaks kept), from a fresh
    adapter of the stored recipe (its tensors' shapes are all the plan reads of it)."""
    from gnq_core.sources.memory_plan import adapter_shape, model_shape, plan_for_batch

    payload = json.loads(path.read_text())
    shape = model_shape(base)
    with tempfile.TemporaryDirectory() as tmp:
        adapter = adapter_shape(sorted(build(Path(tmp), base, 1).iterdir())[0], base)
        for p in payload["points"]:
            if p.get("exit") != 0:
                continue
            common = dict(batch_size=p["batch"], max_length=p["max_length"], dtype="float32",
                          checkpoints=p["checkpoints"], device="cpu", room=2**62, room_source="-",
                          prefetch=p["prefetch"])
            plan = plan_for_batch(shape, adapter=adapter if p["mode"] == "adapter" else None, **common)
            plain = plan_for_batch(shape, **common)
            p |= {"planned_peak_bytes": plan.peak, "planned_as_a_full_model_bytes": plain.peak,
                  "terms": {t.name: t.bytes for t in plan.terms},
                  "planned_over_measured": round(plan.peak / p["peak_rss_bytes"], 3),
                  "planned_as_a_full_model_over_measured": round(plain.peak / p["peak_rss_bytes"], 3)}
            print(p["mode"], p["batch"], p["max_length"], p["planned_over_measured"],
                  p["planned_as_a_full_model_over_measured"])
    path.write_text(json.dumps(payload, indent=2) + "\n")


def where(base: Path, batch: int, length: int) -> dict:
    """Where the adapter's memory goes: the bytes the first batch's probe keeps (every module
    call's inputs and outputs of B+1 examples, engine.plan.planning), by module class, for an
    adapter and for its base audited as a full model, one forward each in this process, against
    the plan's count of the difference (its "adapter layers" term before ADAPTER_OVERHEAD)."""
    from collections import Counter

    import torch

    from gnq_core.engine.auditor import GNQAuditor
    from gnq_core.engine.plan import planning
    from gnq_core.pipelines.audit import load_audited
    from gnq_core.sources.adapters import Adapters
    from gnq_core.sources.memory_plan import ADAPTER_OVERHEAD, adapter_shape, model_shape, plan_for_batch

    torch.set_num_threads(1)
    out: dict = {"batch": batch, "max_length": length}
    with tempfile.TemporaryDirectory() as tmp:
        adapter = sorted(build(Path(tmp), base, 1).iterdir())[0]
        for mode in ("adapter", "base"):
            model, _ = load_audited(adapter if mode == "adapter" else base,
                                    Adapters(base) if mode == "adapter" else None, device=torch.device("cpu"),
                                    dtype=torch.float32, tokenizer=str(base))
            if mode == "base":
                for p in model.parameters():
                    p.requires_grad_(True)
            kept: Counter = Counter()
            real = planning._Recorder.__init__

            def counting(self, model, kept=kept):
                self.calls = {}

                def hook(module, args, kwargs, output, name):
                    leaves = planning._leaves((args, kwargs)), planning._leaves(output)
                    kept[type(module).__name__] += sum(x.nbytes for side in leaves for x in side
                                                       if isinstance(x, torch.Tensor))
                    self.calls.setdefault(name, []).append(leaves)

                self._handles = [m.register_forward_hook(
                    lambda mod, a, k, o, name=name: hook(mod, a, k, o, name), with_kwargs=True)
                    for name, m in model.named_modules()]

            planning._Recorder.__init__ = counting
            try:
                ids = torch.randint(1, 49152, (batch, length), generator=torch.Generator().manual_seed(0))
                with GNQAuditor(model.eval(), lam=1e-2, fused=False):
                    model(input_ids=ids, attention_mask=torch.ones_like(ids))
            finally:
                planning._Recorder.__init__ = real
            out[f"{mode}_probe_bytes_by_module_class"] = dict(kept.most_common())
            out[f"{mode}_probe_bytes"] = sum(kept.values())
            del model
        plan = plan_for_batch(model_shape(base), batch_size=batch, max_length=length, dtype="float32",
                              checkpoints=1, device="cpu", room=2**62, room_source="-",
                              adapter=adapter_shape(adapter, base))
    counted = next(t.bytes for t in plan.terms if t.name == "adapter layers") / ADAPTER_OVERHEAD
    out |= {"probe_bytes_beyond_the_base": out["adapter_probe_bytes"] - out["base_probe_bytes"],
            "plan_counted_bytes": int(counted), "adapter_overhead": ADAPTER_OVERHEAD}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--mode", default="adapter", choices=["adapter", "base"])
    parser.add_argument("--batch", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--texts", type=int, default=16)
    parser.add_argument("--checkpoints", type=int, default=2)
    parser.add_argument("--label", default="lora-r16")
    parser.add_argument("--cap-gb", type=float, default=9.0,
                        help="kill a run whose RSS passes this many GB (a shared machine's other jobs)")
    parser.add_argument("--replan", action="store_true", help="plan the stored points again, measure nothing")
    parser.add_argument("--where", action="store_true",
                        help="count the first batch's probe copies by module class (at the first --batch)")
    args = parser.parse_args()
    if args.replan:
        replan(RESULT, args.model)
        return
    if args.where:
        payload = json.loads(RESULT.read_text())
        payload["where"] = where(args.model, args.batch[0], args.max_length)
        print(json.dumps(payload["where"], indent=1))
        RESULT.write_text(json.dumps(payload, indent=2) + "\n")
        return

    old = json.loads(RESULT.read_text()) if RESULT.exists() else {}
    points = {(p["label"], p["mode"], p["batch"], p["max_length"]): p for p in old.get("points", [])}
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.mode == "adapter":
            series = build(work, args.model, args.checkpoints)
        else:  # the base itself, ``--checkpoints`` times (copies: the audit refuses links out of a folder)
            series = work / "full"
            for i in range(args.checkpoints):
                shutil.copytree(args.model, series / f"checkpoint-{i + 1}")
        data = work / "texts.jsonl"
        data.write_text("".join(json.dumps({"text": t}) + "\n" for t in passages(args.texts, 900)))
        for batch in args.batch:
            point = {"label": args.label, "mode": args.mode, "model": args.model.name,
                     "lora": LORA if args.mode == "adapter" else None, "batch": batch,
                     "max_length": args.max_length, "texts": args.texts, "checkpoints": args.checkpoints,
                     "dtype": "float32 (as stored)"}
            point |= plan_for(series, args.model, batch, args.max_length, args.checkpoints, args.mode)
            _wait_for_room(point["planned_peak_bytes"])
            point |= measure(series, args.model, data, work, batch, args.max_length, args.mode,
                             int(args.cap_gb * 1e9))
            if point["exit"] == 0:
                ratio = point["planned_peak_bytes"] / point["peak_rss_bytes"]
                point["planned_over_measured"] = round(ratio, 3)
                point["planned_as_a_full_model_over_measured"] = round(
                    point["planned_as_a_full_model_bytes"] / point["peak_rss_bytes"], 3)
                if not BOUNDS[0] <= ratio <= BOUNDS[1]:
                    failed.append(point)
            print(json.dumps({k: v for k, v in point.items() if k != "log_tail"}), flush=True)
            points[(args.label, args.mode, batch, args.max_length)] = point
            # after each point: a run killed later (or the machine's memory gone) keeps the earlier ones
            write("adapter_memory", {"what": __doc__.splitlines()[0], "machine": machine(), "bounds": BOUNDS,
                                     "audit_threads": 1, "points": list(points.values())}
                  | ({"where": old["where"]} if "where" in old else {}))
    if failed:
        raise SystemExit(f"{len(failed)} point(s) outside {BOUNDS}x the measured peak")


if __name__ == "__main__":
    main()
