"""torch.compile is refused at setup: the auditor's hooks and its probe forwards (engine/planning.py)
need eager modules.  Under a compiled graph the hooks are traced into it, the probe re-runs see
no captured tensors and the first backward failed deep in planning after minutes of compiling;
this check says so before anything runs."""

from __future__ import annotations

from torch import nn

from gnq_core.errors import GNQError

ADVICE = ("train the audited run without torch.compile (no torch.compile(model), model.compile() or "
          "Trainer(torch_compile=True)), or audit its saved checkpoints post hoc with `gnq audit`")


class CompiledModelError(GNQError, ValueError):
    """The model (or a part of it) is compiled with torch.compile."""


def compiled_parts(model: nn.Module) -> list[str]:
    """Names of the modules of ``model`` that run compiled: ``torch.compile(module)`` wrappers
    (OptimizedModule, which holds the original as ``_orig_mod``) and ``module.compile()``."""
    found = []
    for name, module in model.named_modules():
        if hasattr(module, "_orig_mod") or getattr(module, "_compiled_call_impl", None) is not None:
            found.append(name or "the model")
    return found


def check_not_compiled(model: nn.Module) -> None:
    """Raise ``CompiledModelError`` (one line, naming what to do) when any part of ``model`` is compiled."""
    parts = compiled_parts(model)
    if parts:
        shown = ", ".join(parts[:3]) + (f" and {len(parts) - 3} more" if len(parts) > 3 else "")
        raise CompiledModelError(f"GNQ cannot audit a torch.compile'd model ({shown} compiled): {ADVICE}")


def check_no_compile_setting(torch_compile: bool, dynamo_backend: str | None) -> None:
    """The same refusal for a Trainer that would compile the model when training starts."""
    if torch_compile or (dynamo_backend not in (None, "", "no", "NO")):
        raise CompiledModelError("GNQ cannot audit a torch.compile'd model (the Trainer would compile it: "
                                 f"torch_compile=True or dynamo backend {dynamo_backend!r}): {ADVICE}")
