"""The auditor's look at its first batch: check every parameter use, or plan from a probe.

With ``check_uses`` the first batch is probed once more, hooks off (``engine.plan.planning``), and its
plan re-assigns kernels.  Until then (a first forward that cannot be probed), a ``UseChecker``
watches each forward for parameters used outside the modules that own them (``engine.plan.coverage``).
"""

from __future__ import annotations

from torch import nn

from gnq_core.engine.plan.assignment import Hooked, owners
from gnq_core.engine.plan.batch import BatchDimensionError, leading_dim, module_label
from gnq_core.engine.plan.coverage import UncoveredParametersError, UseChecker
from gnq_core.engine.plan.plan_reuse import PlanCache
from gnq_core.engine.plan.planning import Plan, probe, probeable


class FirstBatch:
    """The checks of the auditor's first batch(es), and their hooks' lifetime."""

    def __init__(self, model: nn.Module, hooked: list[Hooked], check_uses: bool):
        self.model = model
        self.checker: UseChecker | None = None
        self.active = False
        self.planned = not check_uses  # check_uses: plan from a probe of the first batch
        self.plans: PlanCache | None = None  # an earlier checkpoint's plan, reused where provably valid
        if check_uses:
            self.checker = UseChecker(model, owners(model, hooked))

    def settle(self) -> None:
        """Drop a checker whose forward has finished (safe at a root pre-hook: hook dicts are
        copied before iteration)."""
        if self.checker is not None and not self.active and self.checker.done:
            self.checker.remove_hooks()
            self.checker = None

    def wants_plan(self, args: tuple, kwargs: dict) -> bool:
        return not self.planned and probeable(args, kwargs)

    def plan(self, hooked: list[Hooked], args: tuple, kwargs: dict) -> Plan | None:
        """Probe this batch (``engine.plan.planning``); None where it has no batch dimension."""
        self.planned = True
        if self.checker is not None:  # the probe checks parameter uses itself
            self.checker.remove_hooks()
            self.checker = None
        B = leading_dim(args, kwargs)
        if B is None:
            return None
        plan = self.plans.reuse(self.model, hooked, args, kwargs) if self.plans is not None else None
        if plan is not None:  # made from the same structure and batch, and it passed then
            return plan
        covered = {h.name: [id(h.module.get_parameter(n)) for n in h.params] for h in hooked}
        plan = probe(self.model, args, kwargs, B, covered, owners(self.model, hooked, covered))
        if plan.violations:
            raise UncoveredParametersError(plan.violations)
        if plan.refused:
            name, why = next(iter(plan.refused.items()))
            raise BatchDimensionError(
                f"{module_label(self.model, name, self.model.get_submodule(name))} {why}, and no "
                "enclosing module sees batch-first tensors, so its per-example gradients cannot be "
                "attributed")
        if self.plans is not None:
            self.plans.keep(self.model, hooked, args, kwargs, plan)
        return plan

    def watch(self) -> None:
        """Watch this forward's parameter uses, while the checker has not seen one through."""
        if self.checker is not None and not self.checker.done:
            self.active = True
            self.checker.__enter__()

    def forward_done(self) -> None:
        """The root module's forward finished: name the parameters used outside their owners."""
        if not self.active:
            return
        self.active = False
        self.checker.__exit__(None, None, None)
        self.checker.done = True
        if self.checker.violations:
            raise UncoveredParametersError(self.checker.violations)

    def close(self) -> None:
        if self.checker is not None:
            if self.active:
                self.checker.__exit__(None, None, None)
                self.active = False
            self.checker.remove_hooks()
            self.checker = None
