"""torch.compile is refused at setup, and again at every audited forward: the auditor's hooks and
its probe forwards (engine/plan/planning.py) need eager modules.  Under a compiled graph the hooks are
traced into it, the probe re-runs see no captured tensors and the first backward failed deep in
planning (``'NoneType' object has no attribute 'item'``) after minutes of compiling; these
checks say so before anything runs, in every form: a compiled wrapper or ``module.compile()``,
a compiled ``forward`` set on the instance or the class, and any of them done after the
auditor attached (the model called from a compiled callable is seen from the stack)."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from gnq_core.errors import GNQError

ADVICE = ("train the audited run without torch.compile (no torch.compile(model), model.compile(), "
          "model.forward = torch.compile(...) or Trainer(torch_compile=True)), or audit its saved "
          "checkpoints post hoc with `gnq audit`")
AFTER = " after the auditor attached"


class CompiledModelError(GNQError, ValueError):
    """The model (or a part of it) is compiled with torch.compile."""


def _compiled_callable(fn: object) -> bool:
    """``torch.compile(fn)``'s result (dynamo marks it; ``torch.compiler.disable``'s wrapper is not)."""
    return getattr(fn, "_is_torch_compile", False) is True


def compiled_parts(model: nn.Module) -> list[str]:
    """Names of the modules of ``model`` that run compiled, in every attach form:
    ``torch.compile(module)`` wrappers (OptimizedModule, which holds the original as
    ``_orig_mod``), ``module.compile()``, a compiled method set on the instance
    (``module.forward = torch.compile(module.forward)``, the pattern transformers' docs use) and
    a class whose ``forward`` was compiled (``@torch.compile`` on its definition)."""
    found = []
    for name, module in model.named_modules():
        own = vars(module)
        if ("_orig_mod" in own or own.get("_compiled_call_impl") is not None
                or any(_compiled_callable(own.get(attr)) for attr in ("forward", "__call__", "_call_impl"))
                or _compiled_callable(getattr(type(module), "forward", None))):
            found.append(name or "the model")
    return found


def check_not_compiled(model: nn.Module, when: str = "") -> None:
    """Raise ``CompiledModelError`` (one line, naming what to do) when any part of ``model`` is compiled."""
    parts = compiled_parts(model)
    if parts:
        shown = ", ".join(parts[:3]) + (f" and {len(parts) - 3} more" if len(parts) > 3 else "")
        raise CompiledModelError(f"GNQ cannot audit a torch.compile'd model ({shown} compiled{when}): "
                                 f"{ADVICE}")


def check_no_compile_setting(torch_compile: bool, dynamo_backend: str | None) -> None:
    """The same refusal for a Trainer that would compile the model when training starts."""
    if torch_compile or (dynamo_backend not in (None, "", "no", "NO")):
        raise CompiledModelError("GNQ cannot audit a torch.compile'd model (the Trainer would compile it: "
                                 f"torch_compile=True or dynamo backend {dynamo_backend!r}): {ADVICE}")


def _inside_compiled_call() -> bool:
    """Whether the caller runs inside a torch.compile'd callable: dynamo is tracing it, or one of
    the frames below it is dynamo's compile wrapper (a compiled module or function that the
    hooked model was called from, compiled after the auditor attached) or a resumed frame."""
    if torch.compiler.is_compiling():
        return True
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name.startswith("torch_dynamo_resume_in_"):
            return True
        if code.co_filename.endswith(_EVAL_FRAME) and (code.co_name == "compile_wrapper"
                                                       or _optimizing(frame)):
            return True
        frame = frame.f_back
    return False


def _optimizing(frame: Any) -> bool:
    """An eval_frame wrapper frame of a compile (OptimizeContext), not of torch.compiler.disable."""
    from torch._dynamo.eval_frame import OptimizeContext  # dynamo is loaded: its frame is on the stack

    return isinstance(frame.f_locals.get("self"), OptimizeContext)


_EVAL_FRAME = os.path.join("_dynamo", "eval_frame.py")


def compile_guard(model: nn.Module) -> Callable[[], None]:
    """The check an auditor runs at every audited forward: refuse a model compiled after it
    attached, in any form, before a probe or a hook runs in a compiled graph (where captured
    tensors are None).  Made when the auditor is built (eagerly), and run eagerly even when its
    caller is traced, so it sees the real stack."""
    return torch.compiler.disable(functools.partial(_refuse, model))


def _refuse(model: nn.Module) -> None:
    if _inside_compiled_call():
        raise CompiledModelError(f"GNQ cannot audit a torch.compile'd model (called from a compiled "
                                 f"callable, compiled{AFTER}): {ADVICE}")
    check_not_compiled(model, AFTER)
