"""``GNQAuditor``: the one public door to in-run GNQ.

    with GNQAuditor(model, lam=1e-2) as auditor:
        losses = per_example_loss(model, batch)      # [B], each example's own loss
        losses.sum().backward()                      # the training backward
        res = auditor.compute()                      # res.gnq: float64 [B]

Two questions choose the implementation: what the batch of the GNQ is (``batch``) and whose
examples form it (``scope``).  The constructor builds, and returns, the one for the pair:

    batch    scope     the batch of the GNQ                          built from
    "micro"  "rank"    each forward/backward of this process         engine.passes.micro
    "micro"  "global"  that micro-batch on every rank, concatenated  engine.passes.distributed
    "step"   "rank"    every micro-batch of one optimizer step       engine.passes.window
    "step"   "global"  the step's micro-batches on every rank        engine.passes.window_ddp

Every one is a ``GNQAuditor`` (``isinstance`` holds) and gives the numbers the class it is
built from gives: the door only chooses.  An option that belongs to the other batch or scope,
or ``scope="global"`` with no initialised process group, is refused in one line at once rather
than ignored.
"""

from __future__ import annotations

import abc
from typing import Any

import torch.distributed as dist
from torch import nn

from gnq_core.common.values import one_of
from gnq_core.engine.math.conventions import LAM_ABSOLUTE
from gnq_core.engine.math.representations import DEFAULT_MEMORY_BUDGET
from gnq_core.engine.passes.distributed import DistributedGNQAuditor, unwrap_model
from gnq_core.engine.passes.micro import GNQResult, MicroAuditor
from gnq_core.engine.passes.window import WindowAuditor
from gnq_core.engine.passes.window_ddp import DistributedWindowAuditor
from gnq_core.engine.plan.batch import BatchDimensionError

__all__ = ["BATCHES", "SCOPES", "BatchDimensionError", "GNQAuditor", "GNQResult"]

BATCHES = ("micro", "step")
SCOPES = ("rank", "global")
# options that only one batch or scope has: given with the other, they would be silently ignored
STEP_ONLY = ("mode", "sketch", "window_budget", "keep_exact")
GLOBAL_ONLY = ("strategy", "group")


class GNQAuditor(abc.ABC):  # noqa: B024 (an ABC for register(): the door has no methods of its own)
    """Exact per-example GNQ for any PyTorch / Hugging Face model, inside its training loop.

    The auditor returned also has ``backward(loss)`` (the backward a post-hoc audit needs, no
    ``.grad``), ``paused()`` (a block whose passes are ignored), ``coverage`` and ``close()``
    (every hook removed; it is a context manager too).
    """

    def __new__(cls, model: nn.Module, lam: float = 1e-2, *, batch: str = "micro", scope: str = "rank",
                lam_mode: str = LAM_ABSOLUTE, path: str = "auto", memory_budget: int = DEFAULT_MEMORY_BUDGET,
                check_uses: bool = True, fused: bool | None = None, **options: Any) -> GNQAuditor:
        """The auditor for ``batch`` × ``scope`` (the module doc's table).

        Args:
            model: the model being trained (wrapped in DDP / FSDP or not: hooks go on the inner
                module); every trainable parameter gets covered, or this raises
                ``UncoveredParametersError`` naming those that cannot be.
            lam: λ > 0, the ridge of S_{-j} = Σ_{k≠j} g_k g_kᵀ + λI, in the units of ‖g‖².
            batch: "micro" (default): the examples of each forward/backward; ``compute(weights)``
                after each backward gives a ``GNQResult``.  "step": every micro-batch of one
                optimizer step's accumulation window; ``add_micro_batch(weights)`` after each
                backward, ``finish_window()`` at the step gives a ``WindowResult``.  Its options:
                ``mode`` ("auto": exact while the kept factors fit ``window_budget`` bytes, then
                sketched; "exact"; "sketch"), ``sketch`` (a ``SketchSpec``), ``window_budget``,
                ``keep_exact``.
            scope: "rank" (default): this process's examples.  "global": every rank's, in rank
                order, over the initialised torch.distributed process group; every rank constructs
                the auditor and gets the same numbers (``res.local_gnq``: its own rows).  Its
                options: ``strategy`` (what is gathered per layer: "auto", "factors",
                "gradients") and ``group`` (the process group; default all ranks).
            lam_mode: "absolute" (λ = lam) or "relative": λ_eff = lam · mean_j K_jj of each batch,
                scale-free; the result's ``lam`` is the λ each batch used.
            path: "auto" picks ghost or materialise per layer by the cost model; "ghost" /
                "materialize" force one (for tests and benchmarks).
            memory_budget: bytes allowed for one Gram intermediate (chunks beyond it).
            check_uses: probe the first batch once more, hooks off, to follow it through the
                forward and cover modules that do not see batch-first tensors (one extra forward).
            fused: for Linear-like layers where materialising per-example gradients is cheaper,
                return their sum as the weight gradient, so autograd's own weight-gradient matmul is
                skipped (``param.grad`` then matches autograd's to float rounding, not bitwise).
                Default: on for ``batch="micro", scope="rank"``; a global scope and a window need
                every layer's factors after autograd, so they run without.
        """
        settings = {"lam_mode": lam_mode, "path": path, "memory_budget": memory_budget,
                    "check_uses": check_uses}
        if fused is not None:  # None: the implementation's own default
            settings["fused"] = fused
        implementation, fixed = _implementation(batch, scope, options | settings)
        return implementation(unwrap_model(model), lam, **fixed, **options, **settings)


# Each implementation is a GNQAuditor for isinstance / issubclass (the classes built on it too).
GNQAuditor.register(MicroAuditor)


def _implementation(batch: str, scope: str, options: dict[str, Any]) -> tuple[type, dict[str, Any]]:
    """The class for ``batch`` × ``scope`` and the arguments the pair fixes; a contradictory or
    unsupported request is one line."""
    one_of(batch, "GNQAuditor batch", BATCHES)
    one_of(scope, "GNQAuditor scope", SCOPES)
    for names, option, chosen, needed in ((STEP_ONLY, "batch", batch, "step"),
                                          (GLOBAL_ONLY, "scope", scope, "global")):
        given = [name for name in names if name in options]
        if given and chosen != needed:
            raise ValueError(f"GNQAuditor {given[0]}= applies only to {option}={needed!r}, "
                             f"not {option}={chosen!r}")
    if batch == "step" and options.get("fused"):
        raise ValueError("GNQAuditor fused=True applies only to batch='micro': a window needs every layer's "
                         "factors, which a fused layer does not keep")
    if scope == "global" and not (dist.is_available() and dist.is_initialized()):
        raise ValueError("GNQAuditor scope='global' pools the examples of every rank of a torch.distributed "
                         "process group and none is initialised: call torch.distributed.init_process_group "
                         "first, or use scope='rank'")
    if batch == "micro":
        return (MicroAuditor, {}) if scope == "rank" else (DistributedGNQAuditor, {"scope": "global"})
    return (WindowAuditor, {}) if scope == "rank" else (DistributedWindowAuditor, {})
