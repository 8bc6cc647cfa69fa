"""What every attack on an audited checkpoint is: an ``Attack`` has a ``name``, ``run``s on a
``Target`` (the models, texts and token ids loaded once) and ``store``s its result, returning
the counts it adds to the attack's summary, and lists its ``stages`` for the estimate
(attacks/stage_cost.py); ``run_attacks`` runs a list of them in order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

__all__ = ["Attack", "Target", "run_attacks"]


@dataclass
class Target:
    """One attacked checkpoint of a stored run, and what every attack on it shares."""

    store: Any  # results.store.Store
    run: Any  # the run's RunInfo
    point: int
    label: str  # the checkpoint's label, e.g. 'epoch-3'
    model: torch.nn.Module
    tokenizer: Any
    examples: Any  # the run's texts (pandas frame: example_id, text, secret, secret_values)
    ids: list[list[int]]  # each text's token ids (sources.tokens.encode_texts)
    device: torch.device
    batch_size: int
    version: str  # code_version() recorded with the rows
    reporter: Any  # progress.Reporter
    reference: torch.nn.Module | None = None  # the calibration model, or None
    reference_path: str | None = None
    # each text's window (attacks/windows.py), None: the plain rule (tokens[p:p+s]) for every text
    windows: list[Any] | None = None

    @property
    def starts(self) -> list[int | None] | None:
        return None if self.windows is None else [w.start if w is not None else None for w in self.windows]

    @property
    def texts(self) -> list[str]:
        return self.examples["text"].tolist()

    @property
    def example_ids(self) -> list[int]:
        return self.examples["example_id"].tolist()


class Attack(Protocol):
    """An attack: ``run`` computes, ``store`` writes what ``run`` returned and gives its counts;
    ``stages``: what ``run`` does as the estimate times it (attacks/stage_cost.py's ``Stage``, one
    per progress stage ``run`` opens; none for an attack too small to count)."""

    name: str

    @property
    def stages(self) -> tuple: ...

    def run(self, target: Target) -> Any: ...

    def store(self, target: Target, result: Any) -> dict: ...


def run_attacks(attacks: Sequence[Attack], target: Target) -> dict:
    """Run and store each attack in order; their counts merged into one summary."""
    summary: dict = {}
    for attack in attacks:
        summary |= attack.store(target, attack.run(target))
    return summary
