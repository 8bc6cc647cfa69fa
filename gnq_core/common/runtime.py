"""Small runtime facts shared by the commands: device, dtype, code version, seeding, memory."""

from __future__ import annotations

import ctypes
import functools
import random
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16}


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cuda' without a GPU is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but no CUDA GPU is available")
    if name not in ("cpu",) and not name.startswith("cuda"):
        raise ValueError(f"unknown device {name!r} (use auto, cpu or cuda)")
    return torch.device(name)


def resolve_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} (use one of {', '.join(DTYPES)})") from None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@functools.cache
def code_version() -> str:
    """Package version plus the git commit when running from a checkout (recorded with results)."""
    try:
        version = metadata.version("gnq-audit")
    except metadata.PackageNotFoundError:
        version = "unknown"
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=5, check=True, encoding="utf-8").stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5, encoding="utf-8").stdout.strip()
        return f"{version}+g{sha}{'.dirty' if dirty else ''}"
    except (OSError, subprocess.SubprocessError):
        return version


def idle_cores(cores: int, load: float) -> int:
    """Cores not busy now: `cores` less the 1-minute load average, at least 1, at most `cores`."""
    return max(1, min(cores, cores - round(load)))


def default_threads() -> int:
    """torch CPU threads a new job should take on this machine: the cores this process may use,
    at most the physical ones (torch's own default, which the CLI keeps), that the load average
    leaves idle (competing OpenMP threads can slow a step 10×, docs/performance.md)."""
    import os

    import psutil

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cores = min(cores, psutil.cpu_count(logical=False) or cores)
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return idle_cores(cores, load)


def release_freed_memory() -> None:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim``; elsewhere nothing).
    A pass over thousands of texts frees many micro-batch-sized tensors between long-lived small
    ones, and glibc keeps those pages: at 20,000 companions they were ~6 GB of the peak."""
    if sys.platform.startswith("linux"):  # the process's own C library; musl has no malloc_trim
        trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
        if trim is not None:
            trim(0)
