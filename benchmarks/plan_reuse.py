"""An audit's checkpoints with the first batch's plan reused, against planning each one anew.

    python -m benchmarks.plan_reuse --work DIR

On ``attack_throughput prepare``'s data and checkpoints (DIR: texts.csv, checkpoints/): ``run_audit``
over every checkpoint in one process, one thread, CPU seconds (the machine may be shared), with
every checkpoint probed anew (as before the plan was reused) and with the plan kept across
checkpoints (engine.plan.plan_reuse), in the order anew, reused, reused, anew (the process's warm-up
and any drift on both sides).  Per run and checkpoint: its first batch's and its other batches'
CPU seconds; the probes counted; the stored scores compared.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from .common import batch_cpu_timer, write

BATCH, LENGTH = 16, 128


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--name", default="plan_reuse")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import gnq_core.engine.passes.first_batch as first_batch
    import gnq_core.pipelines.audit as audit_module
    from gnq_core.engine.plan.plan_reuse import PlanCache
    from gnq_core.pipelines.settings import AuditSettings
    from gnq_core.results.store import Store
    from gnq_core.sources import find_checkpoints, load_texts

    refs = find_checkpoints(args.work / "checkpoints")
    dataset = load_texts(args.work / "texts.csv")
    calls: list[list[float]] = []
    probes = [0]
    audit_batches, probe = audit_module.audit_batches, first_batch.probe

    timed = batch_cpu_timer(audit_batches, calls)

    def counted(*a, **k):
        probes[0] += 1
        return probe(*a, **k)

    class Never(PlanCache):  # every checkpoint probed anew
        def reuse(self, *a, **k):
            return None

    audit_module.audit_batches, first_batch.probe = timed, counted
    out: dict = {"what": "run_audit over every checkpoint, plan probed per checkpoint vs reused, "
                         "CPU seconds, one process, one thread", "threads": 1, "batch_size": BATCH,
                 "max_length": LENGTH, "checkpoints": len(refs), "texts": len(dataset)}
    scores = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "gnq.duckdb")
        for k, name in enumerate(("anew", "reused", "reused-2", "anew-2")):
            audit_module.PlanCache = Never if name.startswith("anew") else PlanCache
            calls.clear()
            probes[0] = 0
            t0 = time.process_time()
            run = audit_module.run_audit(store, refs, dataset, name=f"{name}-{k}",
                                         settings=AuditSettings(batch_size=BATCH, max_length=LENGTH))
            total = time.process_time() - t0
            firsts = [c[0] for c in calls]
            rest = [sum(c[1:]) / max(1, len(c) - 1) for c in calls]
            extra = [round(f - r, 2) for f, r in zip(firsts, rest, strict=True)]
            out[name] = {"audit_cpu_s": round(total, 1), "probes": probes[0],
                         "first_batch_cpu_s": firsts, "later_batch_mean_cpu_s": [round(r, 2) for r in rest],
                         "first_batch_extra_cpu_s": extra,
                         "batch_cpu_s_per_checkpoint": [list(c) for c in calls]}
            scores[name] = store.scores(run.run_id).sort_values(["point", "example_id"])
            print(name, out[name]["audit_cpu_s"], "s;", out[name]["first_batch_extra_cpu_s"], flush=True)
    for side in ("anew", "reused"):
        runs = [out[side], out[f"{side}-2"]]
        out[f"{side}_mean"] = {key: round(sum(r[key] for r in runs) / 2, 2) for key in ("audit_cpu_s",)}
        out[f"{side}_mean"]["first_batch_extra_cpu_s_sum"] = round(
            sum(sum(r["first_batch_extra_cpu_s"]) for r in runs) / 2, 2)
    a, b = scores["anew"], scores["reused"]
    out["gnq_max_rel_diff"] = float(np.nanmax(np.abs(a["gnq"].to_numpy() - b["gnq"].to_numpy())
                                              / np.abs(a["gnq"].to_numpy())))
    out["gnq_identical"] = bool(np.array_equal(a["gnq"].to_numpy(), b["gnq"].to_numpy(), equal_nan=True))
    out["reused_over_anew"] = out["reused_mean"]["audit_cpu_s"] / out["anew_mean"]["audit_cpu_s"]
    out["saved_cpu_s"] = round(out["anew_mean"]["audit_cpu_s"] - out["reused_mean"]["audit_cpu_s"], 1)
    print(write(args.name, out))


if __name__ == "__main__":
    main()
