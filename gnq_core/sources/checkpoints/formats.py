"""Reading the weight formats without trusting them: a safetensors file's header, pickled weights
only through ``torch.load(weights_only=True)``, and the tensors' names and shapes without their data."""

from __future__ import annotations

import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from gnq_core.errors import one_line
from gnq_core.sources.checkpoints.errors import folder_error, reason


def check_safetensors(file: Path) -> None:
    """Open the file's header: a truncated or corrupt file fails here, named."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            f.keys()
    except Exception as exc:  # SafetensorError, OSError, ...
        raise folder_error(file, f"corrupt or truncated safetensors file ({reason(exc)})") from exc


def _unwrap_state_dict(obj: Any) -> Any:
    """A bare state dict, or one wrapped as {"state_dict": ...} / {"model": ...} / {"module": ...}."""
    if isinstance(obj, dict) and len(obj) == 1:
        (key, value), = obj.items()
        if key in ("state_dict", "model", "module") and isinstance(value, dict):
            return value
    return obj


def _unpickling_reason(exc: BaseException) -> str:
    """The line of torch's weights-only refusal saying what was refused (not its advice to load unsafely)."""
    for line in str(exc).splitlines():
        if "GLOBAL" in line or "Unsupported" in line:
            return one_line(line, limit=200)
    if "weights only" in str(exc).lower():
        return "weights-only load failed"
    return one_line(str(exc), limit=200)


def load_pickled_weights(files: list[Path]) -> dict[str, torch.Tensor]:
    """Merge the state dicts of `files`, read only with torch.load(weights_only=True)."""
    state: dict[str, torch.Tensor] = {}
    for file in files:
        kwargs: dict[str, Any] = {"mmap": True} if zipfile.is_zipfile(file) else {}
        try:
            with warnings.catch_warnings():  # torch's note on a foreign pickle protocol: the refusal says it
                warnings.simplefilter("ignore", UserWarning)
                obj = torch.load(file, map_location="cpu", weights_only=True, **kwargs)
        except pickle.UnpicklingError as exc:
            raise folder_error(file, "refusing to unpickle: the file holds objects other than tensors "
                                     f"({_unpickling_reason(exc)}); convert it to safetensors") from exc
        except Exception as exc:
            raise folder_error(file, f"unreadable weights file ({reason(exc)})") from exc
        obj = _unwrap_state_dict(obj)
        if not isinstance(obj, dict) or not obj:
            raise folder_error(file, f"not a state dict (a {type(obj).__name__})")
        for key, value in obj.items():
            if not isinstance(key, str) or not isinstance(value, torch.Tensor):
                raise folder_error(file, f"not a state dict (entry {key!r} is a {type(value).__name__})")
        state.update(obj)
    return state


_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                       "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                       "U8": torch.uint8, "BOOL": torch.bool}


def meta_state(files: list[Path]) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors files as an empty meta tensor of its shape and dtype."""
    from safetensors import safe_open

    state: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118  (safe_open objects are not iterable)
                piece = f.get_slice(key)
                dtype = _SAFETENSORS_DTYPES.get(piece.get_dtype(), torch.float32)
                state[key] = torch.empty(piece.get_shape(), dtype=dtype, device="meta")
    return state
