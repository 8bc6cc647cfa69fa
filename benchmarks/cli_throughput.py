"""Throughput of `gnq audit` (examples/s per checkpoint) and `gnq extract` (examples/s).

    python -m benchmarks.cli_throughput                 # presets tiny and small, 512 AG News texts

Runs the functions the two commands run (``run_audit``, ``run_extraction``) on real text from
the shared AG News copy, with checkpoints of the model presets saved the way `gnq train`
saves them, into a fresh DuckDB store — so loading, tokenising, the store writes and the
progress plumbing are all in the time.  The command's own start-up (Python imports) is
measured once on its own.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from gnq_core.attacks.run import run_extraction
from gnq_core.pipelines.audit import run_audit
from gnq_core.pipelines.settings import AuditSettings
from gnq_core.results.store import Store
from gnq_core.sources.checkpoints.save import save_checkpoint
from gnq_core.sources.datasets import load_texts
from gnq_core.sources.models import build_model, train_tokenizer

from .common import write

AG_NEWS = Path(__file__).resolve().parents[2] / "shared" / "data" / "ag_news" / "train_2000.csv"


def ag_news_texts(n: int) -> list[str]:
    if not AG_NEWS.exists():
        raise SystemExit(f"{AG_NEWS}: not found (the shared AG News copy is needed)")
    with AG_NEWS.open(newline="", encoding="utf-8") as f:
        rows = [f"{title}. {body}".replace("\\", " ") for _, title, body in csv.reader(f)]
    return rows[:n]


def startup_seconds() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gnq_core.cli", "--help"], check=True, capture_output=True)
    return time.perf_counter() - start


def run(preset: str, n: int, checkpoints: int, batch: int, length: int, prefix: int, work: Path) -> dict:
    texts = ag_news_texts(n)
    data = work / "texts.txt"
    data.write_text("\n".join(texts) + "\n", encoding="utf-8")
    dataset = load_texts(data)
    tokenizer = train_tokenizer(texts, vocab_size=4096)
    folder = work / f"ckpt-{preset}"
    for k in range(checkpoints):
        model = build_model(preset, len(tokenizer), length, seed=k)
        save_checkpoint(model, tokenizer, folder / f"epoch-{k + 1}")
    store = Store(work / f"{preset}.duckdb")
    settings = AuditSettings(batch_size=batch, max_length=length, device="cpu")
    start = time.perf_counter()
    run_ = run_audit(store, folder, dataset, name="bench", settings=settings)
    audit_s = time.perf_counter() - start
    per_point = store.points(run_.run_id)["seconds"].tolist()
    start = time.perf_counter()
    summary = run_extraction(store, run_, prefix_tokens=prefix, suffix_tokens=None, reference=None,
                             device="cpu")
    extract_s = time.perf_counter() - start
    return {
        "preset": preset, "examples": len(dataset), "checkpoints": checkpoints, "batch": batch,
        "max_length": length, "prefix_tokens": prefix, "torch_threads": torch.get_num_threads(),
        "audit_s": audit_s, "audit_point_s": per_point,
        "audit_examples_per_s_per_checkpoint": len(dataset) * checkpoints / audit_s,
        "extract_s": extract_s, "extract_attacked": summary["attacked"],
        "extract_examples_per_s": summary["attacked"] / extract_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", nargs="+", default=["tiny", "small"])
    ap.add_argument("--examples", type=int, default=512)
    ap.add_argument("--checkpoints", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--prefix", type=int, default=12)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gnq-bench-") as tmp:
        for preset in args.preset:
            work = Path(tmp) / preset
            work.mkdir()
            row = run(preset, args.examples, args.checkpoints, args.batch, args.length, args.prefix, work)
            rows.append(row)
            print(f"{preset}: gnq audit {row['audit_examples_per_s_per_checkpoint']:.1f} examples/s per "
                  f"checkpoint; gnq extract {row['extract_examples_per_s']:.1f} examples/s "
                  f"({row['examples']} texts, B={row['batch']}, T<={row['max_length']})")
    startup = startup_seconds()
    print(f"command start-up (imports): {startup:.2f}s")
    path = write("cli_throughput", {"rows": rows, "command_startup_s": startup})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
