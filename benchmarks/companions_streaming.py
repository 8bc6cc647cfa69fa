"""``gnq audit --companions all`` streamed: time and memory against the number of texts, and the
streamed m × m path against the held n × n one on the same texts.

    python -m benchmarks.companions_streaming --sizes 2500 5000 --equal 2000

Tiny GPT-2 preset (2 layers × 64, vocabulary 2048, tokenizer trained on the first 2,000 texts),
texts cut to 64 tokens, the training-set sketch (k = 4096 per matrix in 8 × 8 blocks, 1024
vocabulary buckets × hidden, folded into m = 16,384 dimensions), micro-batches of 16, λ relative
(10⁻² · mean ‖s_j‖²), one thread.  Texts: companions_scale's 20,846 (AG News, WikiText-2,
Tiny Shakespeare), then again with " (copy i)" appended past them.  Each run is a fresh child
process (``--one``) through the pipeline's ``audit_companions`` (one companion set of every text),
so its peak resident memory is its own; wall and CPU seconds of each pass and of the factor are
taken from the reporter's stage changes and ``SketchSystem.factor``.

``--equal N`` runs N texts in float64 both ways (``companions_solve`` "texts": the n × n Gram;
"sketch": streamed) and reports the largest relative GNQ difference.

The cost at larger n is extrapolated from the measured sizes (``extrapolate``):
T(n) = T_fixed + n · t_text, fitted by least squares on the measured (n, CPU seconds), where T_fixed
is the factor (Cholesky of the m × m system, m³/3 FLOPs, and its condition number) and set-up, and
t_text is two passes of the model plus the syrk (m² FLOPs a text) and the triangular solve (m²
FLOPs a text); memory stays at the largest measured peak (one m × m matrix and a block of rows,
whatever n).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from .common import write

LENGTH, BATCH, VOCAB, LAM = 64, 16, 2048, 1e-2


def load_texts(n: int) -> list[str]:
    from .companions_scale import load_texts as base

    rows = base(20_846)
    out = rows[:n]
    copy = 1
    while len(out) < n:
        out += [f"{t} (copy {copy})" for t in rows[: n - len(out)]]
        copy += 1
    return out


def one(n: int, solve: str, dtype: str, out: Path | None) -> dict:
    torch.set_num_threads(1)
    from gnq_core.engine.sketch import companions as engine
    from gnq_core.pipelines import companions
    from gnq_core.pipelines.settings import AuditSettings
    from gnq_core.common.progress import Reporter
    from gnq_core.sources.models import build_model, train_tokenizer
    from gnq_core.sources.tokens import Partition

    texts = load_texts(n)
    tok = train_tokenizer(texts[:2000], VOCAB)
    model = build_model("tiny", len(tok), LENGTH, seed=0)
    if dtype == "float64":
        model = model.double()
    settings = AuditSettings(batch_size=BATCH, max_length=LENGTH, companions="all", lam=LAM,
                             lam_mode="relative", dtype=dtype, companions_solve=solve)
    marks: list[tuple[str, float, float]] = []

    class Marks(Reporter):
        def stage(self, label: str, total: int) -> None:
            marks.append((label, time.perf_counter(), time.process_time()))
            super().stage(label, total)

    factor_times: dict[str, float] = {}
    inner = engine.SketchSystem.factor

    def timed(self, lam):
        w, c = time.perf_counter(), time.process_time()
        out = inner(self, lam)
        factor_times.update(factor_wall_s=time.perf_counter() - w, factor_cpu_s=time.process_time() - c)
        return out

    engine.SketchSystem.factor = timed
    sets = Partition(np.arange(n, dtype=np.int64), np.array([0, n], dtype=np.int64))
    w, c = time.perf_counter(), time.process_time()
    cols, results = companions.audit_companions(model, tok, texts, sets, [0], settings, torch.device("cpu"),
                                                Marks())
    wall, cpu = time.perf_counter() - w, time.process_time() - c
    assert results[0].finite and results[0].size == n, results[0]
    gnq = cols.values[:n, 0]
    if out is not None:
        np.save(out, gnq)
    row = {"n": n, "solve": solve, "dtype": dtype, "m": companions.sketch_spec(settings).shared,
           "total_wall_s": wall, "total_cpu_s": cpu, "peak_rss_bytes": resource.getrusage(
               resource.RUSAGE_SELF).ru_maxrss * 1024, "gnq_median": float(np.nanmedian(gnq)),
           "condition": results[0].condition, **factor_times}
    if len(marks) == 2:  # streamed: pass 1 from the start to its stage, pass 2 from its stage to the end
        (_, w1, c1), (_, w2, c2) = marks
        row |= {"pass1_wall_s": w2 - w1 - factor_times.get("factor_wall_s", 0.0),
                "pass1_cpu_s": c2 - c1 - factor_times.get("factor_cpu_s", 0.0),
                "pass2_wall_s": w + wall - w2, "pass2_cpu_s": c + cpu - c2}
    return row


def child(n: int, solve: str, dtype: str, out: Path | None = None) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.companions_streaming", "--one", str(n), "--solve", solve,
           "--dtype", dtype] + (["--out", str(out)] if out is not None else [])
    done = subprocess.run(cmd, capture_output=True, text=True, check=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(done.stdout.strip().splitlines()[-1])


def extrapolate(rows: list[dict], targets: list[int]) -> dict:
    """T(n) = T_fixed + n · t_text (least squares on the measured CPU and wall seconds); memory the
    largest measured peak (it does not grow with n: one m × m matrix and a block of rows)."""
    n = np.array([r["n"] for r in rows], dtype=np.float64)
    fits = {}
    for key in ("total_cpu_s", "total_wall_s"):
        slope, fixed = np.polyfit(n, np.array([r[key] for r in rows]), 1)
        fits[key] = {"fixed_s": float(fixed), "per_text_s": float(slope)}
    peak = max(r["peak_rss_bytes"] for r in rows)
    return {"formula": "T(n) = fixed_s + n * per_text_s (least squares on the measured sizes); "
                       "peak memory = the largest measured peak (independent of n)",
            "fit": fits, "predicted": [{"n": t, "cpu_s": fits["total_cpu_s"]["fixed_s"]
                                        + t * fits["total_cpu_s"]["per_text_s"],
                                        "wall_s": fits["total_wall_s"]["fixed_s"]
                                        + t * fits["total_wall_s"]["per_text_s"],
                                        "peak_rss_bytes": peak} for t in targets]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[2500, 5000])
    parser.add_argument("--equal", type=int, default=2000,
                        help="texts for the streamed = n × n check (0: none)")
    parser.add_argument("--equal-from", type=Path, default=None,
                        help="with --equal 0: keep the equality check of this earlier results file")
    parser.add_argument("--targets", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--one", type=int, default=None)
    parser.add_argument("--solve", default="sketch")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.one, args.solve, args.dtype, args.out)))
        return
    equal = {}
    if args.equal:
        with tempfile.TemporaryDirectory() as tmp:
            runs = {solve: child(args.equal, solve, "float64", Path(tmp) / f"{solve}.npy")
                    for solve in ("texts", "sketch")}
            held, streamed = (np.load(Path(tmp) / f"{solve}.npy") for solve in ("texts", "sketch"))
        rel = np.abs(streamed - held) / np.abs(held)
        equal = {"n": args.equal, "dtype": "float64", "max_rel_diff": float(rel.max()),
                 "median_rel_diff": float(np.median(rel)), "runs": runs}
        print(equal, flush=True)
    if not args.equal and args.equal_from is not None:
        earlier = json.loads(args.equal_from.read_text())
        equal = earlier["equal"] | {"from_run_of": earlier["when"]}
    rows = []
    for n in args.sizes:
        rows.append(child(n, "sketch", "float32"))
        print(rows[-1], flush=True)
    path = write("companions_streaming", {"preset": "tiny", "length": LENGTH, "batch": BATCH, "vocab": VOCAB,
                                          "lam": f"{LAM} x mean |s_j|^2", "threads": 1, "equal": equal,
                                          "measured": rows, "extrapolation": extrapolate(rows, args.targets),
                                          "load_average": os.getloadavg()})
    print(path)


if __name__ == "__main__":
    main()
