"""What every kernel implements, and the small helpers they share.

A kernel knows one family of modules.  In the forward pass it saves what it needs from the
module's inputs (``capture``); once the output gradients exist it returns representations of
the per-example gradients of the module's trainable parameters (``contributions``).  The
auditor turns those into B×B Gram blocks and drops them right away.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gnq_core.engine.kernels.fused import FuseRequest
from gnq_core.engine.math.representations import DenseRep, Rep
from gnq_core.errors import GNQError

_state = threading.local()


@contextlib.contextmanager
def hooks_suspended() -> Iterator[None]:
    """Auditor hooks ignore module calls made inside this block (kernels' own recomputation)."""
    previous = getattr(_state, "suspended", False)
    _state.suspended = True
    try:
        yield
    finally:
        _state.suspended = previous


def hooks_are_suspended() -> bool:
    return getattr(_state, "suspended", False)


class UnsupportedModuleError(GNQError, RuntimeError):
    """A module whose per-example gradients are not defined (e.g. BatchNorm in train mode)."""


@dataclass
class Contribution:
    """Per-example gradients of ``params`` (local names of the module's parameters)."""

    params: tuple[str, ...]
    rep: Rep


class Kernel:
    """Base class: subclasses set ``name`` and implement ``capture`` and ``contributions``."""

    name = "kernel"
    recurse = False  # True: the kernel also owns its submodules' parameters (they get no hooks)
    fusable = False  # True: ``fused_forward`` can run the module so its backward reports itself
    row_lookup = False  # True: a call's gradient touches only the rows ``rows_touched`` names

    def refusal(self, module: nn.Module) -> str | None:
        """Why this kernel's module's per-example gradients are not defined, if it knows they are
        not; asked of every module before the first batch is planned (``registry.refusal``)."""
        return None

    def rows_touched(self, saved: Any) -> torch.Tensor | None:
        """Parameter rows (flat ids) a call's gradient can be non-zero on; None: any row."""
        return None

    def fused_forward(self, module: nn.Module, args: tuple, kwargs: dict, request: FuseRequest) -> Any:
        """The module's output from a function whose backward hands this call's per-example
        gradients (or their Gram) to ``request.open_sink()``, or ``NotImplemented`` to run the
        ordinary forward with hooks.  Only called when ``fusable`` is True."""
        return NotImplemented

    def capture(
        self, module: nn.Module, args: tuple, kwargs: dict, output: Any, batch_size: int
    ) -> Any:
        raise NotImplementedError

    def contributions(
        self,
        module: nn.Module,
        saved: Any,
        grads: Sequence[torch.Tensor | None],
        params: Sequence[str],
        split: frozenset[str],
    ) -> list[Contribution]:
        """Representations of the per-example gradients of ``params``.

        ``grads`` are the gradients of the module's differentiable outputs (None where an
        output got none).  A name in ``split`` is also used elsewhere in this forward pass, so
        its representation must stand alone, in the parameter's own layout.
        """
        raise NotImplementedError


def first_input(args: tuple, kwargs: dict, name: str = "input") -> torch.Tensor:
    if args:
        return args[0]
    if name in kwargs:
        return kwargs[name]
    raise TypeError(f"expected the module's input as first argument or '{name}='")


def batch_first(x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """x with a leading batch dimension of ``batch_size`` (a broadcast leading 1 is expanded)."""
    if x.dim() == 0:
        raise ValueError("a scalar input has no batch dimension")
    if x.shape[0] == batch_size:
        return x
    if x.shape[0] == 1:
        return x.expand(batch_size, *x.shape[1:])
    raise ValueError(
        f"input has leading dimension {x.shape[0]}, but the batch has {batch_size} examples; "
        "per-example gradients need batch-first inputs"
    )


def dense_contributions(per_example: dict[str, torch.Tensor], split: frozenset[str]) -> list[Contribution]:
    """Contributions from explicit per-example gradients {name: [B, ...]}: one joint block
    for the unshared parameters, one block each for the shared ones."""
    flat = {n: g.reshape(g.shape[0], -1) for n, g in per_example.items()}
    out = [Contribution((n,), DenseRep(flat[n])) for n in flat if n in split]
    joint = [n for n in flat if n not in split]
    if joint:
        out.append(Contribution(tuple(joint), DenseRep(torch.cat([flat[n] for n in joint], 1))))
    return out
