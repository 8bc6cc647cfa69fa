"""Shared benchmark plumbing: machine description, interleaved repeats, JSON results."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch
import transformers

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": "cpu",
    }
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def interleaved(fns: dict[str, Callable[[], None]], repeats: int, sync: Callable[[], None] = lambda: None,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, dict]:
    """Run each variant once per round, alternating, and report the median seconds
    (``clock=time.process_time``: this process's CPU seconds, steadier on a shared machine)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync()
            start = clock()
            fn()
            sync()
            times[name].append(clock() - start)
    return {k: {"median_s": statistics.median(v), "all_s": v} for k, v in times.items()}


def interleaved_timed(fns: dict[str, Callable[[], float]], repeats: int) -> dict[str, dict]:
    """Like ``interleaved`` for variants that time themselves (set-up outside their timer)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(fn())
    return {k: {"median_s": statistics.median(v), "all_s": v} for k, v in times.items()}


def write(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    tag = machine()["device"].replace(" ", "-").lower()
    path = RESULTS / f"{name}-{tag}.json"
    payload = {"benchmark": name, "when": datetime.now(UTC).isoformat(timespec="seconds"),
               "machine": machine(), **payload}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def ratio_limits(pairs: list[str]) -> dict[str, float]:
    """``VARIANT=LIMIT`` pairs (``--max-ratio``) as {variant: limit}; a malformed pair stops the run."""
    limits = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        try:
            limits[name] = float(value) if sep else float("nan")
        except ValueError:
            limits[name] = float("nan")
        if not limits[name] > 0:
            raise SystemExit(f"--max-ratio {pair!r}: expected VARIANT=LIMIT with a positive number")
    return limits


def check_ratios(ratios: dict[str, float], limits: dict[str, float]) -> dict:
    """Each variant's ratio against its limit: the verdict the results file records.  A variant
    over its limit (or limited and not measured) fails; ``exit_on_failure`` then stops the run."""
    failed = {v: ratios.get(v) for v, limit in limits.items() if not ratios.get(v, float("inf")) <= limit}
    return {"limits": limits, "ratios": {v: ratios.get(v) for v in limits}, "failed": failed}


def exit_on_failure(verdict: dict, path: Path) -> None:
    """A regression stops loudly (exit 1) after the results are written, naming the variant."""
    for v, ratio in verdict["failed"].items():
        shown = "not measured" if ratio is None else f"{ratio:.3f}x"
        print(f"FAIL: {v} {shown} is over its limit {verdict['limits'][v]:.2f}x (results in {path})",
              file=sys.stderr)
    if verdict["failed"]:
        raise SystemExit(1)


def batch_cpu_timer(audit_batches: Callable, calls: list[list[float]]) -> Callable:
    """``audit_batches`` that appends each call's per-batch CPU seconds to ``calls`` (a batch timed
    from the audit's asking for it to its asking for the next: its tokenising included)."""
    def timed(model, batches, *rest, **kwargs):
        marks = []

        def marked():
            for batch in batches:
                marks.append(time.process_time())
                yield batch

        result = audit_batches(model, marked(), *rest, **kwargs)
        marks.append(time.process_time())
        calls.append([round(b - a, 2) for a, b in zip(marks, marks[1:], strict=False)])
        return result

    return timed
