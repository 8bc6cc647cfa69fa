"""Max RSS of `gnq audit` against the number of texts (issue 20: bounded memory).

    PYTHONPATH=$PWD python -m benchmarks.audit_memory --n 20000 200000 2000000

Each point runs the real CLI (`python -m gnq_core.cli audit`) as a child process on N short
synthetic texts (5-9 words from a 300-word vocabulary plus a number; every 100th text repeats an
earlier one, so the copies-apart partition has work to do), one checkpoint of the tiny preset,
on the CPU, into a fresh DuckDB store; the child's max RSS comes from ``os.wait4``.  Points are
merged into ``benchmarks/results/audit_memory-<device>.json`` (``--label`` names a series, e.g.
the code version measured), so a slow point can be added later without rerunning the others.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import RESULTS, machine, write

ROOT = Path(__file__).resolve().parents[1]
WORDS = [f"{a}{b}" for a in ("ka", "lo", "mi", "ne", "po", "ru", "se", "ti", "vu", "zo")
         for b in ("bar", "den", "fip", "gol", "hum", "jix", "kel", "mon", "nut", "pel",
                   "quo", "ras", "sol", "tam", "ulo", "vek", "wen", "xar", "yem", "zud",
                   "ard", "bel", "cor", "dax", "eft", "fon", "gri", "hal", "ivo", "jun")]


def write_texts(path: Path, n: int, seed: int = 0) -> None:
    """N short texts, one a line, written as they are generated (never all held)."""
    rng = random.Random(seed)
    recent: list[str] = []
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            if i % 100 == 99 and recent:
                text = rng.choice(recent)  # an exact copy of a recent text
            else:
                text = " ".join(rng.choices(WORDS, k=rng.randint(5, 9))) + f" {rng.randint(0, 10**6)}"
                recent = (recent + [text])[-50:]
            f.write(text + "\n")


def prepare(work: Path, length: int) -> Path:
    """One tiny-preset checkpoint with a tokenizer trained on the benchmark's own kind of text."""
    from gnq_core.sources.checkpoints.save import save_checkpoint
    from gnq_core.sources.models import build_model, train_tokenizer

    sample = work / "sample.txt"
    write_texts(sample, 5000, seed=1)
    tok = train_tokenizer(sample.read_text(encoding="utf-8").splitlines(), vocab_size=512)
    folder = work / "tiny"
    save_checkpoint(build_model("tiny", len(tok), length, seed=0), tok, folder)
    return folder


def measure(n: int, checkpoint: Path, work: Path, batch: int, length: int, threads: int) -> dict:
    data = work / f"texts-{n}.txt"
    write_texts(data, n)
    db = work / f"audit-{n}.duckdb"
    cmd = [sys.executable, "-m", "gnq_core.cli", "audit", "--checkpoints", str(checkpoint),
           "--data", str(data), "--db", str(db), "--name", "bench", "--batch-size", str(batch),
           "--max-length", str(length),
           "--device", "cpu", "--threads", str(threads), "--quiet"]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    log = work / f"audit-{n}.log"
    start = time.perf_counter()
    with log.open("wb") as out:  # the child's output to a file, so os.wait4 can reap it (and its rusage)
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = code = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"gnq audit of {n} texts failed ({code}): {log.read_text()[-2000:]}")
    data.unlink()
    db.unlink()
    return {"texts": n, "max_rss_mb": usage.ru_maxrss / 1024, "wall_s": wall, "texts_per_s": n / wall,
            "batch_size": batch, "max_length": length, "threads": threads}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[20_000, 200_000])
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--label", default="streaming", help="the series the points belong to")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    args = ap.parse_args()
    previous = RESULTS / f"audit_memory-{machine()['device'].replace(' ', '-').lower()}.json"
    series = json.loads(previous.read_text())["series"] if previous.exists() else {}
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        checkpoint = prepare(work, args.max_length)
        for n in args.n:
            row = measure(n, checkpoint, work, args.batch_size, args.max_length, args.threads)
            print(json.dumps(row), flush=True)
            points = {p["texts"]: p for p in series.get(args.label, [])} | {n: row}
            series[args.label] = [points[k] for k in sorted(points)]
            write("audit_memory", {"what": "max RSS of `gnq audit` (one tiny-preset checkpoint, CPU) of N "
                                           "short texts", "series": series, "slopes": _slopes(series)})


def _slopes(series: dict) -> dict:
    """KB of max RSS per extra text between consecutive points of each series."""
    out = {}
    for label, points in series.items():
        out[label] = [{"from": a["texts"], "to": b["texts"],
                       "kb_per_text": (b["max_rss_mb"] - a["max_rss_mb"]) * 1024 / (b["texts"] - a["texts"])}
                      for a, b in zip(points, points[1:], strict=False)]
    return out


if __name__ == "__main__":
    main()
