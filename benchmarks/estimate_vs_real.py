"""The measured estimate (pipelines/estimate_probe.py) against the real time, stage by stage.

    python -m benchmarks.estimate_vs_real --checkpoints DIR --data FILE [--batch-size 16 --max-length 64]

Probes the first checkpoint as ``gnq estimate`` does, then runs the job it estimated in this
process (``run_audit`` over every checkpoint, then ``run_extraction`` with the first checkpoint as
reference), timing each progress stage from the Reporter's stage changes.  In one process, as a
dashboard job runs its steps: the imports (a few seconds per `gnq` command) are in neither.  The
load average before and after is recorded: the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from gnq_core.pipelines.estimate_probe import estimate_lines, measure_estimate, stage_of, total_seconds
from gnq_core.common.progress import Reporter

from .common import write


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoints", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--name", default="estimate_vs_real")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from gnq_core.attacks.run import run_extraction
    from gnq_core.pipelines.audit import run_audit
    from gnq_core.pipelines.settings import AuditSettings
    from gnq_core.results.store import Store
    from gnq_core.sources import find_checkpoints, load_texts

    refs = find_checkpoints(args.checkpoints)
    dataset = load_texts(args.data)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    work, probe = measure_estimate(str(refs[0].path), dataset, batch_size=args.batch_size,
                                   max_length=args.max_length, threads=args.threads, checkpoints=len(refs),
                                   reference=len(refs) > 1)
    probe_s = time.perf_counter() - t0
    lines = estimate_lines(work, probe)

    spent: dict[str, float] = {}
    current: list = [None, time.perf_counter()]

    def sink(done: int, total: int, label: str, unit: str) -> None:
        now = time.perf_counter()
        if label != current[0]:
            if current[0] is not None:
                key = stage_of(current[0])
                spent[key] = spent.get(key, 0.0) + now - current[1]
            current[0], current[1] = label, now

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        with Reporter(sink=sink) as reporter:
            store = Store(Path(tmp) / "gnq.duckdb")
            settings = AuditSettings(batch_size=args.batch_size, max_length=args.max_length)
            run = run_audit(store, refs, dataset, name="real", settings=settings, reporter=reporter)
            audit_end = time.perf_counter()
            run_extraction(store, run, reporter=reporter)
        real_s = time.perf_counter() - t0
    now = time.perf_counter()
    key = stage_of(current[0])
    spent[key] = spent.get(key, 0.0) + now - current[1]
    # what no stage counts (loading the models, writing the rows) goes to the first audit stage
    # and to the attack's stages as they open: the sum of stages is the job's whole time
    rows = [{"stage": x.stage, "what": x.what, "count": x.count, "noun": x.noun, "estimated_s": x.seconds,
             "real_s": spent.get(x.stage)} for x in lines]
    estimated = total_seconds(lines)
    payload = {"checkpoints": len(refs), "texts": len(dataset), "data": str(args.data),
               "batch_size": args.batch_size, "max_length": args.max_length, "threads": args.threads,
               "probe_s": probe_s, "estimated_s": estimated, "real_s": real_s,
               "real_audit_s": audit_end - t0, "ratio_real_to_estimate": real_s / estimated,
               "stages": rows, "load_average_before": load_before, "load_average_after": os.getloadavg(),
               "note": "one process (a dashboard job's steps); imports excluded; the machine is shared"}
    print(f"estimated {estimated:.1f} s, real {real_s:.1f} s (ratio {real_s / estimated:.2f}), "
          f"probe {probe_s:.1f} s")
    for r in rows:
        print(f"  {r['stage']:14s} est {r['estimated_s']:7.1f} s  real {r['real_s'] or 0:7.1f} s")
    print(write(args.name, payload))


if __name__ == "__main__":
    main()
