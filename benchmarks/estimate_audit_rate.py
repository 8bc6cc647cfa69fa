"""The measured estimate's audit line against the real audit, in CPU seconds of one process.

    git show REV:gnq_core/pipelines/estimate_probe.py > /tmp/probe_before.py   # optional
    python -m benchmarks.estimate_audit_rate --work DIR [--before /tmp/probe_before.py]

On ``attack_throughput prepare``'s data and checkpoints (DIR): the probe's audit line
(``measure_estimate`` without the attacks, its clock patched to CPU seconds) of this tree, and of
an older estimate_probe.py given as ``--before``, then ``run_audit`` over every checkpoint with
each batch's CPU seconds, one thread.  The machine may be shared: CPU seconds, not wall time.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import torch

from .common import batch_cpu_timer, write

BATCH, LENGTH = 16, 128


def _module(path: Path):
    spec = importlib.util.spec_from_file_location("estimate_probe_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--before", type=Path, help="an older gnq_core/pipelines/estimate_probe.py")
    parser.add_argument("--name", default="estimate_audit_rate")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import gnq_core.pipelines.audit as audit_module
    import gnq_core.pipelines.estimate_probe as after
    from gnq_core.pipelines.settings import AuditSettings
    from gnq_core.results.store import Store
    from gnq_core.sources import find_checkpoints, load_texts

    refs = find_checkpoints(args.work / "checkpoints")
    dataset = load_texts(args.work / "texts.csv")
    probes = ([("before", _module(args.before))] if args.before else []) + [("after", after)]
    out: dict = {"what": "the estimate's audit line against run_audit over every checkpoint, CPU seconds, "
                         "one process", "threads": 1, "batch_size": BATCH, "max_length": LENGTH,
                 "checkpoints": len(refs), "texts": len(dataset)}
    wall, time.perf_counter = time.perf_counter, time.process_time  # the probes' clock: CPU seconds
    try:
        for name, module in probes:
            t0 = time.process_time()
            work, probe = module.measure_estimate(str(refs[0].path), dataset, batch_size=BATCH,
                                                  max_length=LENGTH, threads=1, checkpoints=len(refs),
                                                  attack=False)
            line = module.estimate_lines(work, probe)[0]
            out[name] = {"probe_cpu_s": time.process_time() - t0, "audit_line_s": line.seconds,
                         "assumed": line.assumed, "audit_batch_s": probe.audit_batch_s,
                         "audit_fixed_s": probe.audit_fixed_s, "load_s": probe.load_s}
    finally:
        time.perf_counter = wall

    calls: list[list[float]] = []  # each audit call's batches, CPU seconds
    audit_batches = audit_module.audit_batches
    audit_module.audit_batches = batch_cpu_timer(audit_batches, calls)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.process_time()
        audit_module.run_audit(Store(Path(tmp) / "gnq.duckdb"), refs, dataset, name="real",
                               settings=AuditSettings(batch_size=BATCH, max_length=LENGTH))
        real = time.process_time() - t0
    audit_module.audit_batches = audit_batches
    out["real"] = {"audit_cpu_s": real, "batch_cpu_s_per_checkpoint": calls}
    for name, _ in probes:
        out[name]["estimate_over_real"] = out[name]["audit_line_s"] / real
        said = out[name]
        print(f"{name}: estimated {said['audit_line_s']:.1f} s ({said['assumed']}), real {real:.1f} s "
              f"({said['estimate_over_real']:.2f}×)")
    print(write(args.name, out))


if __name__ == "__main__":
    main()
