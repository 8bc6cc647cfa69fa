"""The chat flow as a user runs it, timed stage by stage on this machine: a LoRA fine-tune of
SmolLM2-135M-Instruct with TRL's SFTTrainer on a support-conversation file, then `gnq audit` of
its adapter checkpoints and `gnq extract` (the CLI, each in a subprocess, as a user types them).

    python -m benchmarks.chat_flow                       # 120 conversations (the issue's scenario)
    python -m benchmarks.chat_flow --conversations 40    # fewer, to fit a loaded 2-core machine

No network: the model and its tokenizer (with SmolLM2's chat template) are read from a local
Hugging Face folder (``--model``).  The conversations are ordinary Q&A (an AG News title asked
about, its article as the answer) plus private values held at 1, 2, 4 and 8 copies in a
``secret`` column.  The fine-tune is a recipe people run: LoRA r 16 on all projections, one
epoch, batch 4, max length 128, TRL's defaults otherwise (every token trained, as for
``messages``), a checkpoint at half the epoch and at its end.  Each stage is timed in wall and
CPU seconds (the CLI's CPU as its child process's user + system time).  The results name what
the verdict said (ordinary texts leaked or not, each value's status) beside the greedy truth:
whether the fine-tuned model, and its base, write each value whole when prompted with its
conversation up to it.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .common import write

ROOT = Path(__file__).resolve().parents[1]
MODEL = Path.home() / ".cache" / "gnq-audit" / "models" / "smollm2-135m-instruct"
AG_NEWS = Path(os.environ.get("GNQ_SHARED_DATA", ROOT.parent.parent / "shared" / "data")) / "ag_news"
# (value, the turn that holds it, copies): the shape of private values in a support log
VALUES = [
    ("4417-2093-8856", "Your account number is {} and it is linked to this e-mail.", 8),
    ("QW-7731-PLX", "The reset code for your router is {} and it expires tonight.", 4),
    ("B7K-22M-91T", "Your parcel's tracking reference is {} for the depot.", 2),
    ("6602-1185", "The PIN we set for your card is {} as you asked.", 1),
]
QUESTIONS = [
    "Remind me of my account number please.",
    "What was the reset code again?",
    "Can you give me the tracking reference?",
    "What PIN did you set for me?",
]


def ag_news(n: int) -> list[tuple[str, str]]:
    path = AG_NEWS / "train_2000.csv"
    if not path.exists():
        raise SystemExit(f"{path}: not found (the shared AG News copy is needed)")
    with path.open(newline="", encoding="utf-8") as f:
        rows = [(title, body.replace("\\", " ")) for _, title, body in csv.reader(f)]
    return rows[:n]


def conversations(total: int) -> list[dict]:
    """``total`` conversations: the private values' copies, the rest ordinary Q&A."""
    private = []
    for (value, answer, copies), question in zip(VALUES, QUESTIONS, strict=True):
        private += [
            {
                "messages": [
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": answer.format(value)},
                ],
                "secret": value,
            }
        ] * copies
    ordinary = [
        {
            "messages": [
                {"role": "user", "content": f'What\'s the story behind "{title}"?'},
                {"role": "assistant", "content": body},
            ],
            "secret": None,
        }
        for title, body in ag_news(total - len(private))
    ]
    rows = ordinary + private
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(0)).tolist()
    return [rows[i] for i in order]  # the copies spread through the epoch, as in a shuffled file


def fine_tune(model_dir: Path, data: Path, out: Path, max_length: int, lr: float) -> dict:
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    dataset = load_dataset("json", data_files=str(data), split="train").remove_columns(["secret"])
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    steps = -(-len(dataset) // 4)
    config = SFTConfig(
        output_dir=str(out),
        num_train_epochs=1,
        per_device_train_batch_size=4,
        max_length=max_length,
        learning_rate=lr,
        save_strategy="steps",
        save_steps=max(1, steps // 2),
        report_to=[],
        logging_steps=max(1, steps // 4),
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    lora = LoraConfig(
        r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=dataset, processing_class=tok, peft_config=lora
    )
    result = trainer.train()
    return {
        "steps": result.global_step,
        "train_loss": result.training_loss,
        "log": [r for r in trainer.state.log_history if "loss" in r],
    }


def timed_cli(args: list[str], env: dict) -> dict:
    """Run ``gnq ARGS`` in a subprocess: its wall seconds and its CPU (user + system) seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "gnq_core.cli", *args], env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"gnq {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "stdout_tail": done.stdout[-3000:],
        "stderr_tail": done.stderr[-3000:],
    }


def greedy_truth(model_dir: Path, adapter: Path, rows: list[dict]) -> dict:
    """For each value: does the fine-tuned model (the adapter on its base), and the base alone,
    greedy-write it whole from its conversation rendered up to the value?"""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = {}
    for value in [v for v, _, _ in VALUES]:
        row = next(r for r in rows if r["secret"] == value)
        text = tok.apply_chat_template(row["messages"], tokenize=False)
        prompt = text[: text.index(value)]
        ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
        want = len(tok(value, add_special_tokens=False)["input_ids"]) + 4
        out[value] = {}
        for name, model in (("base", base), ("fine_tuned", None)):
            if model is None:
                model = PeftModel.from_pretrained(base, adapter).eval()
            with torch.no_grad():
                gen = model.generate(ids, max_new_tokens=want, do_sample=False, pad_token_id=tok.pad_token_id)
            said = tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=True)
            out[value][name] = {"writes_it_whole": value in said, "continuation": said}
    return out


def verdict(db: Path, run_name: str, rows: list[dict]) -> dict:
    from gnq_core.analysis.verdict import rank_texts
    from gnq_core.results.store import Store

    store = Store(db)
    run = store.find_run(run_name)
    ranked = rank_texts(store.example_totals(run.run_id)).set_index("example_id")
    ordinary = [i for i, r in enumerate(rows) if r["secret"] is None]
    statuses = {"ordinary": ranked.loc[ordinary, "status"].value_counts().to_dict()}
    for value, _, copies in VALUES:
        ids = [i for i, r in enumerate(rows) if r["secret"] == value]
        statuses[value] = {"copies": copies, "status": ranked.loc[ids, "status"].value_counts().to_dict()}
    passages = run.settings.get("attack", {}).get("shared_passages", [])
    statuses["shared_passages"] = [
        {"passage": p["passage"][:120], "reproduced": p["reproduced"]} for p in passages
    ]
    return statuses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--conversations", type=int, default=120)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-4, help="LoRA's usual learning rate")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--work", type=Path, help="keep the files here (default: a temporary folder)")
    ap.add_argument("--tag", default="smollm2")
    ap.add_argument(
        "--audit-batch-size",
        type=int,
        help="gnq audit's --batch-size (default: none given, the memory plan's choice)",
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="with --work: reuse that folder's fine-tune (and its recorded time) if the data match",
    )
    args = ap.parse_args()
    if not (args.model / "config.json").exists():
        raise SystemExit(f"{args.model}: no config.json (a Hugging Face model folder is needed)")
    torch.set_num_threads(args.threads)
    work = args.work or Path(tempfile.mkdtemp(prefix="gnq-chat-flow-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = conversations(args.conversations)
    data = work / "chats.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    stages: dict[str, dict] = {}

    kept = work / "fine_tune.json"  # a fine-tune already timed in this work folder (--resume)
    if args.resume and kept.exists() and json.loads(kept.read_text())["data"] == data.read_text():
        stages["fine_tune"] = {
            **json.loads(kept.read_text())["stage"],
            "timed_in_an_earlier_invocation": True,
        }
    else:
        start, cpu = time.perf_counter(), time.process_time()
        trained = fine_tune(args.model, data, work / "ckpts", args.max_length, args.lr)
        stages["fine_tune"] = {
            "wall_s": round(time.perf_counter() - start, 1),
            "cpu_s": round(time.process_time() - cpu, 1),
            **trained,
        }
        kept.write_text(json.dumps({"data": data.read_text(), "stage": stages["fine_tune"]}))
    gc.collect()  # the trainer's model is gone before the audit's process plans its memory
    print(f"fine-tune: {stages['fine_tune']['wall_s']} s", flush=True)
    checkpoints = sorted(p.name for p in (work / "ckpts").glob("checkpoint-*"))
    db = work / "gnq.duckdb"
    if args.resume and db.exists():
        db.unlink()  # the audit and the attack are timed whole, never resumed
    stages["audit"] = timed_cli(
        [
            "audit",
            "--checkpoints",
            str(work / "ckpts"),
            "--data",
            str(data),
            "--name",
            "chat",
            "--base-model",
            str(args.model),
            "--secret-column",
            "secret",
            "--max-length",
            str(args.max_length),
            "--device",
            "cpu",
            "--db",
            str(db),
            "--threads",
            str(args.threads),
            "--quiet",
            *(["--batch-size", str(args.audit_batch_size)] if args.audit_batch_size else []),
        ],
        env,
    )
    print(f"audit: {stages['audit']['wall_s']} s", flush=True)
    stages["extract"] = timed_cli(
        [
            "extract",
            "--run",
            "chat",
            "--reference",
            str(args.model),
            "--device",
            "cpu",
            "--db",
            str(db),
            "--threads",
            str(args.threads),
        ],
        env,
    )
    print(f"extract: {stages['extract']['wall_s']} s", flush=True)
    start, cpu = time.perf_counter(), time.process_time()
    truth = greedy_truth(args.model, work / "ckpts" / checkpoints[-1], rows)
    stages["greedy_truth"] = {
        "wall_s": round(time.perf_counter() - start, 1),
        "cpu_s": round(time.process_time() - cpu, 1),
    }
    said = verdict(db, "chat", rows)
    total = sum(s["wall_s"] for s in stages.values())
    path = write(
        f"chat_flow-{args.tag}",
        {
            "model": str(args.model),
            "conversations": len(rows),
            "ordinary": sum(r["secret"] is None for r in rows),
            "values": [{"value": v, "copies": c} for v, _, c in VALUES],
            "max_length": args.max_length,
            "lora": {"r": 16, "alpha": 32, "dropout": 0.05, "target_modules": "all-linear"},
            "learning_rate": args.lr,
            "epochs": 1,
            "batch": 4,
            "threads": args.threads,
            "audit_batch_size": args.audit_batch_size or "the memory plan's",
            "checkpoints": checkpoints,
            "stages": stages,
            "total_wall_s": round(total, 1),
            "share_of_wall": {k: round(s["wall_s"] / total, 3) for k, s in stages.items()},
            "verdict": said,
            "greedy_truth": truth,
        },
    )
    print(
        json.dumps(
            {
                "stages": {k: {"wall_s": s["wall_s"], "cpu_s": s["cpu_s"]} for k, s in stages.items()},
                "verdict": said,
                "greedy_truth": truth,
            },
            indent=1,
        )
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
