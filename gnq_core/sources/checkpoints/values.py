"""Numbers a checkpoint carries, checked before a run starts: a NaN or infinite value in
config.json (``layer_norm_epsilon: NaN``) or in a floating-point weight makes every batch
non-finite, so the audit would store nothing but ``finite = false`` rows and call itself done.
Refused in one line naming the field or tensor; ``GNQ_ALLOW_NONFINITE=1`` audits such weights anyway
(their batches are stored as non-finite).  A weight stored as integers where the model's is
floating point is refused too."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch


def _floats(raw: Any, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, float]]:
    if depth > 8:
        return
    if isinstance(raw, dict):
        for key, value in raw.items():
            yield from _floats(value, f"{prefix}{key}.", depth + 1)
    elif isinstance(raw, list):
        for i, value in enumerate(raw):
            yield from _floats(value, f"{prefix}{i}.", depth + 1)
    elif isinstance(raw, float):
        yield prefix.rstrip("."), raw


def nonfinite_config_field(raw: dict[str, Any]) -> str | None:
    """The first field of a parsed config.json holding NaN or ±Infinity (Python's json reads them)."""
    return next((f"{name} = {value}" for name, value in _floats(raw) if not math.isfinite(value)), None)


def integer_weight(state: Mapping[str, torch.Tensor], parameters: Iterable[str]) -> str | None:
    """The first tensor stored as an integer or boolean type where the model has a floating-point
    weight (e.g. a quantized checkpoint without its quantization config): loading would cast it
    silently and the audit would measure a different model.  Integer buffers (position ids, masks)
    are not weights.  Names match as stored or up to the base model's prefix."""
    names = set(parameters)
    for key, tensor in state.items():
        if tensor.is_floating_point() or tensor.is_complex():
            continue
        if key in names or any(p.endswith(f".{key}") or key.endswith(f".{p}") for p in names):
            dtype = str(tensor.dtype).removeprefix("torch.")
            return f"tensor {key!r} is stored as {dtype}, not floating point"
    return None


def nonfinite_tensor(files: list[Path]) -> str | None:
    """The first floating-point tensor of the safetensors ``files`` holding NaN or ±Inf, read one
    tensor at a time (memory-mapped), or None."""
    from safetensors import safe_open

    if os.environ.get("GNQ_ALLOW_NONFINITE") == "1":
        return None
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (a safe_open handle is not a dict)
                tensor = handle.get_tensor(name)
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                    return f"{file.name}: tensor {name!r}"
    return None
