"""What a job's stage tells the estimate (pipelines/estimate_probe.py) of its cost.

Each job kind lists its stages as objects (``Stage``): the audit's in pipelines/audit_stage.py,
the attack's on each stored attack (attacks/stored.py, ``Attack.stages``; their cost models in
attacks/attack_stages.py).  A stage says which progress labels it reports (``label``, the
``Reporter.stage`` labels its code opens), counts its work in the job's data (``count``), runs a
few units of its own code on the probe's model and texts under the estimate's ``Clock``
(``measure``), and turns the counts and unit costs into its line (``line``).  The estimate has no
stage logic of its own: a stage added to a job kind's list is counted, measured and shown.

This contract sits with the attacks because it is the lowest floor that runs a stage: the
attacks and the pipelines (the audit) both declare stages, and the attacks may not import the
pipelines.  A stage's counts and unit costs beyond the named fields of ``Work`` and ``Probe``
go in their ``counts`` and ``units`` mappings, read with ``get``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from gnq_core.attacks.defaults import (
    DEFAULT_ATTACK_BATCH,
    DEFAULT_EXPOSURE_NODES,
    DEFAULT_PREFIX,
    DEFAULT_SECRET_CANDIDATES,
    DEFAULT_SUFFIX,
)

__all__ = ["WARM_UP_S", "Clock", "Line", "Probe", "ProbeRun", "Stage", "Work", "split_named"]

WARM_UP_S = 2.0  # a first unit quicker than this may hold one-time costs (allocations, kernel choices)


@dataclass(frozen=True)
class Work:
    """What the job will do, counted from its data and settings before it starts."""

    texts: int
    checkpoints: int
    batch_size: int
    attackable: int = 0  # texts the attack decodes (attacks.extraction.attackable)
    attack: bool = True
    reference: bool = True  # the attack calibrated: the reference model decodes and scores too
    suffix: int | None = DEFAULT_SUFFIX  # None: no discoverable pass
    attack_batch: int = DEFAULT_ATTACK_BATCH
    secret_values: int = 0  # attackable occurrences
    distinct_values: int = 0  # distinct values with an exposure space (copies share one)
    formats: int = 0  # (kind, template) pairs: each gets NULL_VALUES never-trained values
    secret_candidates: int = DEFAULT_SECRET_CANDIDATES
    mean_tokens: float = 0.0
    prefix: int = DEFAULT_PREFIX
    exposure_nodes: int = DEFAULT_EXPOSURE_NODES
    counts: Mapping[str, int] = field(default_factory=dict)  # a stage's counts beyond the fields above

    def get(self, name: str) -> Any:
        """A count by name: a field, else ``counts``' (0 when no stage counted it)."""
        return getattr(self, name) if name in _names(Work) else self.counts.get(name, 0)


@dataclass(frozen=True)
class Probe:
    """Unit costs measured on the model and machine, in seconds."""

    load_s: float  # one checkpoint loaded
    audit_batch_s: float  # one audit batch of Work.batch_size texts
    decode_s: float  # one attack batch of texts' windows greedy-decoded (attacks.extraction)
    forward_s: float  # one attack batch of texts scored (attacks.membership.token_logprobs)
    exposure_s: float | None  # one of the run's values' exposure (None: no secret value to try)
    threads: int
    model: str  # what was measured, said in the basis
    audit_fixed_s: float = 0.0  # once per audit (its first batch's plan of the model), besides its batches
    # each later checkpoint's first batch: the kept plan checked (engine.plan.plan_reuse), besides its batches
    audit_reuse_s: float = 0.0
    # a later never-trained value after a prompt already searched (the null's values share the
    # prompt's scorer: attacks.exposure.Scorers); None: as ``exposure_s``
    exposure_shared_s: float | None = None
    # one secret value greedy-decoded by one model, from one batch of the run's own secret prompts
    # as the attack batches them (longer prompts than a text window's); None: as a text window's
    secret_decode_s: float | None = None
    # one attack batch of texts cut to p + s tokens scored (the discoverable pass); None: forward_s
    suffix_forward_s: float | None = None
    # the audit's memory plan (sources.memory_plan.MemoryPlan), and the attack's (the reference
    # model held besides); None: not planned
    memory: Any = None
    attack_memory: Any = None
    units: Mapping[str, float | None] = field(default_factory=dict)  # a stage's costs beyond the fields

    def get(self, name: str) -> Any:
        """A unit cost by name: a field, else ``units``' (None when no stage measured it)."""
        return getattr(self, name) if name in _names(Probe) else self.units.get(name)


@dataclass(frozen=True)
class Line:
    stage: str  # the stage's key ("audit", "attack", ...)
    what: str
    count: int
    noun: str
    seconds: float
    assumed: str


@dataclass(frozen=True)
class ProbeRun:
    """What an attack stage reads of the run (attacks.contract.Target.run) in the probe."""

    seed: int
    max_length: int
    settings: Mapping[str, Any] = field(default_factory=dict)


class Clock(Protocol):
    """The estimate's timer: ``now`` after the device's queued work; ``timed(fn)`` the seconds of
    ``fn()``, run again when the first call was quick (it paid one-time costs)."""

    def now(self) -> float: ...

    def timed(self, fn: Callable[[], Any]) -> float: ...


class Stage(Protocol):
    """One stage of a job kind, as the estimate sees it (module docstring).  ``inputs``: what the
    job kind's stages run on in the probe (the audit's: pipelines.audit_stage.AuditProbe; the
    attacks': an attacks.contract.Target on the probe's model and texts)."""

    key: str  # the estimate line's key
    label: re.Pattern[str] | None  # the progress labels its code reports; None: the audit's (any other)

    def count(self, inputs: Any, scale: float) -> dict[str, int]:
        """Its work counted on the probe's texts, a sample scaled by ``scale`` to the whole data."""
        ...

    def measure(self, inputs: Any, clock: Clock) -> dict[str, float | None]:
        """Its unit costs: a few units of its own code timed on the probe's model."""
        ...

    def line(self, work: Work, probe: Probe) -> Line | None:
        """Its line of the estimate (None: it does no work under these settings)."""
        ...


def split_named(values: Mapping[str, Any], cls: type) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the values that are fields of ``cls``, the others): a stage's counts or costs laid out as
    ``Work``'s / ``Probe``'s fields and their ``counts`` / ``units``."""
    names = _names(cls)
    return ({k: v for k, v in values.items() if k in names},
            {k: v for k, v in values.items() if k not in names})


def _names(cls: type) -> set[str]:
    return {f.name for f in fields(cls)} - {"counts", "units"}
