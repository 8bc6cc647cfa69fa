"""Max RSS of `gnq audit` against the number of texts (issue 20 item 5: bounded memory).

Each size is a fresh `gnq audit` process over one tiny-preset checkpoint and N short texts; its
max RSS comes from the kernel (wait4).  The slope between sizes is the memory per text; the
projection to 2,000,000 texts extends the largest measured size by that slope.

    PYTHONPATH=$PWD python -m benchmarks.audit_memory --sizes 50000 200000 500000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import write

WORDS = ("river", "market", "engine", "garden", "letter", "window", "signal", "harbor", "winter", "copper")


def short_text(i: int) -> str:
    """A short, mostly distinct text (~40 characters, ~10 tokens)."""
    return f"note {i}: the {WORDS[i % 10]} near {WORDS[(i // 10) % 10]} {i % 997}"


def write_texts(path: Path, n: int) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(short_text(i) + "\n")
    return path


def make_checkpoint(folder: Path, max_length: int) -> Path:
    from gnq_core.sources.checkpoints import save_checkpoint
    from gnq_core.sources.models import build_model, train_tokenizer

    tokenizer = train_tokenizer([short_text(i) for i in range(2000)], vocab_size=512)
    save_checkpoint(build_model("tiny", len(tokenizer), max_length, seed=0), tokenizer, folder)
    return folder


def audit_rss(checkpoint: Path, data: Path, db: Path, *, max_length: int, batch_size: int,
              threads: int) -> tuple[float, float]:
    """(max RSS in MB, wall seconds) of one `gnq audit` process."""
    cmd = [sys.executable, "-m", "gnq_core.cli", "audit", "--checkpoints", str(checkpoint), "--data",
           str(data), "--db", str(db), "--max-length", str(max_length), "--batch-size", str(batch_size),
           "--threads", str(threads), "-q"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"gnq audit failed: {proc.stderr.read() if proc.stderr else ''}")
    return usage.ru_maxrss / 1024, seconds  # ru_maxrss is in KiB on Linux


def measure(sizes: list[int], work: Path, *, max_length: int = 16, batch_size: int = 16,
            threads: int = 2) -> list[dict]:
    checkpoint = make_checkpoint(work / "checkpoint", max_length)
    rows = []
    for n in sizes:
        data = write_texts(work / f"texts-{n}.txt", n)
        rss, seconds = audit_rss(checkpoint, data, work / f"audit-{n}.duckdb", max_length=max_length,
                                 batch_size=batch_size, threads=threads)
        rows.append({"texts": n, "max_rss_mb": round(rss, 1), "seconds": round(seconds, 1)})
        print(rows[-1], flush=True)
        data.unlink()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50_000, 200_000, 500_000])
    parser.add_argument("--max-length", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--target", type=int, default=2_000_000, help="Size to project to.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(args.sizes, Path(tmp), max_length=args.max_length, batch_size=args.batch_size,
                       threads=args.threads)
    first, last = rows[0], rows[-1]
    slope = (last["max_rss_mb"] - first["max_rss_mb"]) * 2**20 / max(1, last["texts"] - first["texts"])
    projected = last["max_rss_mb"] + slope * (args.target - last["texts"]) / 2**20
    path = write("audit_memory", {
        "what": "max RSS of one `gnq audit` process: tiny preset, one checkpoint, N short texts (.txt)",
        "settings": {"max_length": args.max_length, "batch_size": args.batch_size, "threads": args.threads},
        "rows": rows,
        "bytes_per_text": round(slope),
        "projected": {"texts": args.target, "max_rss_mb": round(projected),
                      "how": "largest measured size plus the per-text slope between the smallest and "
                             "largest size (a projection, not a measurement)"},
    })
    print(f"{round(slope)} bytes per text; {args.target:,} texts projected at {projected:.0f} MB; {path}")


if __name__ == "__main__":
    main()
