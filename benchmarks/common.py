"""Shared benchmark plumbing: machine description, interleaved repeats, JSON results."""

from __future__ import annotations

import json
import os
import platform
import statistics
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
