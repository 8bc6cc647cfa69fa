"""The audit job's stages as the estimate sees them (attacks/stage_cost.py): its batches of
per-text gradients and the GNQ solve, timed in ``audit_batches`` itself, on batches drawn as the
audit draws them (``seeded_partition``, ``stream_batches``, a chat text's trained tokens)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from gnq_core.attacks.stage_cost import WARM_UP_S, Clock, Line, Probe, Work
from gnq_core.common.progress import TEXTS
from gnq_core.pipelines.settings import AuditSettings
from gnq_core.sources.datasets import TextDataset


@dataclass(frozen=True)
class AuditProbe:
    """What the audit's stages run on in the probe: the first checkpoint loaded as the audit loads
    it (pipelines.audit.load_audited), the probe's texts and the audit's settings."""

    model: torch.nn.Module
    tokenizer: Any
    dataset: TextDataset  # the probe's texts (a seeded sample of a large data set)
    settings: AuditSettings  # its batch size resolved (the memory plan's)
    device: torch.device
    checkpoints: int
    trainable_only: bool = False  # a PEFT adapter's parameters only (not merged)


@dataclass(frozen=True)
class AuditBatches:
    """Every checkpoint's batches: a unit is one audit batch of ``batch_size`` texts; the audit
    also pays once, in its first batch, for the auditor's plan of the model (engine.passes.first_batch:
    two more forwards, hooks off), and each later checkpoint's first batch checks that the kept
    plan still holds (engine.plan.plan_reuse: one forward) instead."""

    key: str = "audit"
    label: None = None  # a checkpoint's stage is labelled by the checkpoint itself: every other label

    def count(self, inputs: AuditProbe, scale: float) -> dict[str, int]:
        return {}  # Work.texts × Work.checkpoints, in batches of Work.batch_size

    def measure(self, inputs: AuditProbe, clock: Clock) -> dict[str, float | None]:
        """The first and the next batches are timed in one call, as the audit runs them.  A quick
        first batch may hold the process's one-time costs (kernel compilation, first allocations):
        then three are timed again, planned anew.  Then, for a series, the first batch again on the
        kept plan."""
        from gnq_core.engine.plan.plan_reuse import PlanCache
        from gnq_core.sources.tokens import seeded_partition

        s = inputs.settings
        partition = seeded_partition(len(inputs.dataset), s.batch_size, s.seed)
        plans = PlanCache()
        times = self._batches(inputs, partition, list(range(min(2, len(partition)))), plans, clock)
        if times[0] < WARM_UP_S and len(partition) > 2:
            plans = PlanCache()
            times = self._batches(inputs, partition, [0, 1, 2], plans, clock)
        batch_s = sum(times[1:]) / len(times[1:]) if len(times) > 1 else times[0]
        reuse_s = (max(0.0, self._batches(inputs, partition, [0], plans, clock)[0] - batch_s)
                   if inputs.checkpoints > 1 else 0.0)
        return {"audit_batch_s": batch_s, "audit_fixed_s": max(0.0, times[0] - batch_s),
                "audit_reuse_s": reuse_s}

    @staticmethod
    def _batches(inputs: AuditProbe, partition, batches: list[int], plans, clock: Clock) -> list[float]:
        """Seconds of each of ``batches`` in one audit call, as one checkpoint's audit runs them
        (one auditor: its first batch also pays its plan, or its check of ``plans``' plan); a batch
        is timed from the end of the one before, its tokenising included."""
        from gnq_core.pipelines.audit import audit_batches, trained_masks
        from gnq_core.sources.tokens import stream_batches

        s = inputs.settings
        marks = [clock.now()]

        def marked(stream: Iterator) -> Iterator:
            for k, batch in enumerate(stream):
                if k:  # the audit asks for the next batch once it has finished this one
                    marks.append(clock.now())
                yield batch

        stream = stream_batches(inputs.tokenizer, inputs.dataset.texts, partition, batches, s.max_length,
                                trained_masks(inputs.dataset))
        audit_batches(inputs.model, marked(stream), s.lam, inputs.device, None, indices=batches,
                      capacity=s.batch_size * len(batches), loss=s.loss, lam_mode=s.lam_mode,
                      trainable_only=inputs.trainable_only, plans=plans)
        marks.append(clock.now())
        return [b - a for a, b in itertools.pairwise(marks)]

    def line(self, work: Work, probe: Probe) -> Line:
        batches = math.ceil(work.texts / max(1, work.batch_size))
        later = max(0, work.checkpoints - 1)
        return Line(self.key, "gradient audit", work.texts * work.checkpoints, TEXTS,
                    work.checkpoints * (probe.load_s + batches * probe.audit_batch_s) + probe.audit_fixed_s
                    + later * probe.audit_reuse_s,
                    f"{work.checkpoints} checkpoint(s) × ({probe.load_s:.1f} s to load + {batches} batch(es) "
                    f"× {probe.audit_batch_s:.2f} s) + {probe.audit_fixed_s:.1f} s once to plan the model in "
                    f"the first batch + {later} later checkpoint(s) × {probe.audit_reuse_s:.1f} s to check "
                    "the plan still holds; measured on the first checkpoint's first batches")


def audit_stages() -> list:
    """The audit job's stages, in the order it runs them."""
    return [AuditBatches()]
