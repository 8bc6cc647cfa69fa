"""Post-hoc ``gnq audit --companions all``: time and memory against the number of texts.

    python -m benchmarks.companions_scale --sizes 250 500 1000 2000

Tiny GPT-2 preset (2 layers × 64, vocabulary 2048, tokenizer trained on the texts), float32,
AG News texts (title + description) cut to 64 tokens, the default sketch (k = 4096 per matrix
in 8 × 8 blocks, 1024 vocabulary buckets × hidden, folded into 65,536 shared dimensions),
micro-batches of 16, one thread.  Each size
runs in a fresh child process (``--one N``) through the pipeline's ``audit_companions`` (one
companion set of every text), so its peak resident memory is its own; the solve
(``companion_gnq``) is timed apart.  Wall seconds and this process's CPU seconds are both
reported (the machine is shared).  The figure for 20,000 texts is an extrapolation from the
largest size measured (``extrapolate``); ``--one 20000 --no-split --save NAME`` measures it.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from .common import write

DATA = Path("/work/shared/data/ag_news/test.csv")
LENGTH, BATCH, VOCAB = 64, 16, 2048


def load_texts(n: int) -> list[str]:
    """The first n texts of AG News's test rows, then (past its 7,600) its 2,000 train rows,
    WikiText-2's non-heading lines and Tiny Shakespeare's speeches: 20,846 texts in all."""
    rows = []
    for path in (DATA, DATA.with_name("train_2000.csv")):
        with path.open(newline="", encoding="utf-8") as f:
            rows += [f"{r[1]}. {r[2]}".replace("\\n", " ") for r in csv.reader(f)]
    root = DATA.parents[1]
    for name in ("wiki.test.raw", "wiki.valid.raw"):
        lines = (root / "wikitext2" / name).read_text(encoding="utf-8").splitlines()
        rows += [line.strip() for line in lines if line.strip() and not line.strip().startswith("=")]
    speeches = (root / "extra" / "tinyshakespeare.txt").read_text(encoding="utf-8").split("\n\n")
    rows += [s.strip() for s in speeches if s.strip()]
    if n > len(rows):
        raise SystemExit(f"{root} has {len(rows)} texts, not {n}")
    return rows[:n]


def one(n: int, threads: int = 1, split: bool = True) -> dict:
    torch.set_num_threads(threads)
    from gnq_core.engine.sketch.projection import SketchSpec
    from gnq_core.pipelines import companions
    from gnq_core.pipelines.settings import AuditSettings
    from gnq_core.sources.models import build_model, train_tokenizer
    from gnq_core.sources.tokens import Partition

    texts = load_texts(n)
    tok = train_tokenizer(texts[:2000], VOCAB)
    model = build_model("tiny", len(tok), LENGTH, seed=0)
    settings = AuditSettings(batch_size=BATCH, max_length=LENGTH, companions="all", lam_mode="relative")
    solve: dict[str, float] = {}
    inner = companions.companion_gnq

    def timed(S: torch.Tensor, lam: float, mode: str):
        solve["m"] = S.shape[1]
        solve["sketch_bytes"] = S.numel() * S.element_size()
        w, c = time.perf_counter(), time.process_time()
        held = [S]  # hand on the only reference, as audit_companions does: the n × n path frees
        del S       # the sketches once their Gram exists (a local S here kept 5 GB at 20,000 texts)
        out = inner(held.pop(), lam, mode)
        solve["solve_wall_s"], solve["solve_cpu_s"] = time.perf_counter() - w, time.process_time() - c
        solve["space"] = out.space
        return out

    companions.companion_gnq = timed
    sets = Partition(np.arange(n, dtype=np.int64), np.array([0, n], dtype=np.int64))
    w, c = time.perf_counter(), time.process_time()
    cols, results = companions.audit_companions(model, tok, texts, sets, [0], settings, torch.device("cpu"))
    wall, cpu = time.perf_counter() - w, time.process_time() - c
    assert results[0].finite and results[0].size == n, results[0]
    gnq = cols.values[:n, 0]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if split:  # the solve without the Gram (Cholesky, M, h: ∝ n³), timed on an SPD matrix of the same size
        solve |= factor_split(n, solve["solve_cpu_s"])
    return {"n": n, "threads": threads, "total_wall_s": wall, "total_cpu_s": cpu,
            "pass_cpu_s": cpu - solve["solve_cpu_s"], "peak_rss_bytes": peak,
            "sketch": SketchSpec().describe(), "gnq_median": float(np.nanmedian(gnq)), **solve}


def factor_split(n: int, solve_cpu_s: float) -> dict:
    from gnq_core.engine.sketch.companions import kernel_gnq

    X = torch.randn(n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    K = X @ X.T / n
    del X
    c = time.process_time()
    kernel_gnq(K, 1.0)
    factor = time.process_time() - c
    return {"factor_cpu_s": factor, "gram_cpu_s": solve_cpu_s - factor}


def extrapolate(rows: list[dict], target: int) -> dict:
    """From the largest measured size n0: the pass ∝ n, the Gram ∝ n² (m fixed), the factor
    (Cholesky, M, h) ∝ n³; memory max(n·m·4 + n²·8, 3·n²·8) (sketches and K while the Gram is
    formed; K, L, M in the solve) plus the largest run's remainder (interpreter, model, chunks)."""
    r = max(rows, key=lambda row: row["n"])
    n0, m, f = r["n"], r["m"], target / r["n"]

    def held(n: int) -> int:
        return max(n * m * 4 + n ** 2 * 8, 3 * n ** 2 * 8)

    out = {"n": target, "extrapolated": True, "from_n": n0, "pass_cpu_s": r["pass_cpu_s"] * f,
           "gram_cpu_s": r["gram_cpu_s"] * f ** 2, "factor_cpu_s": r["factor_cpu_s"] * f ** 3,
           "peak_memory_bytes": held(target) + r["peak_rss_bytes"] - held(n0),
           "sketch_bytes": target * m * 4, "gram_bytes": target ** 2 * 8}
    out["total_cpu_s"] = out["pass_cpu_s"] + out["gram_cpu_s"] + out["factor_cpu_s"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[250, 500, 1000, 2000])
    parser.add_argument("--one", type=int, default=None)
    parser.add_argument("--target", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=1, help="with --one: torch threads")
    parser.add_argument("--no-split", action="store_true",
                        help="with --one: skip timing the solve's factorisation apart (a second n³ solve)")
    parser.add_argument("--save", default=None,
                        help="with --one: also write benchmarks/results/NAME-<device>.json")
    args = parser.parse_args()
    if args.one is not None:
        row = one(args.one, args.threads, not args.no_split)
        print(json.dumps(row))
        if args.save:
            print(write(args.save, {"preset": "tiny", "length": LENGTH, "batch": BATCH, "vocab": VOCAB,
                                    "threads": args.threads, "measured": [row],
                                    "load_average": os.getloadavg()}))
        return
    rows = []
    for n in args.sizes:
        out = subprocess.run([sys.executable, "-m", "benchmarks.companions_scale", "--one", str(n)],
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    path = write("companions_scale", {"preset": "tiny", "length": LENGTH, "batch": BATCH, "vocab": VOCAB,
                                      "threads": 1, "measured": rows,
                                      "extrapolation": extrapolate(rows, args.target)})
    print(path)


if __name__ == "__main__":
    main()
