"""The precision a run's gradients were computed in: recorded with the run, shown with its results.

GNQ is computed from the gradients the training step itself forms.  Under bf16/fp16 (a Trainer
with ``bf16=True``/``fp16=True``, a user's ``torch.autocast``, or half-precision weights) those
gradients are half precision, so GNQ follows the half-precision gradients: within 1e-3 of the
explicit gradients of the same forward (tests/engine/test_precision.py), but possibly tens of percent
from the float32/float64 gradients of the same weights.  The run records both facts
(``settings["compute_dtype"]``, ``settings["mixed_precision"]``) and the result pages say so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the result pages read the note without importing torch
    import torch

HALF = ("bfloat16", "float16")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def trainer_precision(args: Any, model: torch.nn.Module) -> dict[str, str]:
    """What a Trainer's arguments and the model's weights say before the first step:
    ``compute_dtype`` and ``mixed_precision`` ("bf16", "fp16" or "no")."""
    weights = dtype_name(next(model.parameters()).dtype)
    if getattr(args, "bf16", False):
        return {"compute_dtype": "bfloat16", "mixed_precision": "bf16"}
    if getattr(args, "fp16", False):
        return {"compute_dtype": "float16", "mixed_precision": "fp16"}
    return {"compute_dtype": weights, "mixed_precision": "no"}


def observed_precision(output: torch.Tensor, autocast: bool, recorded: Mapping[str, str]) -> dict[str, str]:
    """The precision seen in a training forward (the dtype of the output head's output, and whether
    autocast was on), merged into ``recorded``: a user's own ``torch.autocast`` around the training
    loop shows up here and nowhere in the Trainer's arguments."""
    seen = dtype_name(output.dtype)
    if seen == recorded.get("compute_dtype"):
        return dict(recorded)
    mode = recorded.get("mixed_precision", "no")
    if autocast and mode == "no":
        mode = f"torch.autocast({seen})"
    return {"compute_dtype": seen, "mixed_precision": mode}


# A post-hoc audit of half-precision weights computed as stored: the forward and backward in bf16/fp16,
# the Gram blocks and the solve in float32 (engine.math.representations.compute_dtype, engine.math.solve).
# Measured against the same weights audited in float64 (a tiny Llama, batch 8 × 48 tokens): GNQ within
# 5e-3 of the largest GNQ, the loss within 1e-4; tests/sources/test_memory_plan.py holds a bf16
# checkpoint's audit to that bound.
HALF_AUDIT_ERROR = 5e-3


def audit_precision(source: str | None, compute: str) -> dict[str, str]:
    """A post-hoc audit's precision settings: the dtype the checkpoint's weights are stored in, the
    one the audit computed in, and, when that is half precision, that its GNQ is approximate."""
    out = {"source_dtype": source or "unknown", "compute_dtype": compute, "mixed_precision": "no"}
    if compute in HALF:
        out["precision"] = (f"approximate: computed in {compute} as stored, Grams and solve in float32; "
                            f"GNQ within {HALF_AUDIT_ERROR:g} (relative) of float64 on a tiny model")
    elif source in HALF:
        out["precision"] = f"{source} weights upcast to {compute} (--dtype {compute})"
    return out


def precision_note(settings: Mapping[str, Any]) -> str | None:
    """One line when the run's gradients were half precision, else None."""
    dtype = settings.get("compute_dtype")
    if dtype not in HALF:
        return None
    if settings.get("precision", "").startswith("approximate"):  # a post-hoc audit as stored
        return (f"{settings['precision']}; audit with --dtype float32 or float64 for exact gradients of "
                "these weights")
    mode = settings.get("mixed_precision", "no")
    how = "half-precision weights" if mode in (None, "no") else f"mixed precision {mode}"
    return (f"gradients were {dtype} ({how}): GNQ follows these gradients and can differ by tens of "
            "percent from float32/float64 ones; audit the saved checkpoints post hoc in float32 or "
            "float64 to compare")
