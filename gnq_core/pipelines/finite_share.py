"""A run whose batches are mostly non-finite (NaN/Inf loss or gradients) has failed, whatever its
loop thought: it ends 'failed' with the count in its message and one line on stderr, instead of
'done' with nearly every GNQ missing.  Its rows are kept (the non-finite batches are marked)."""

from __future__ import annotations

from gnq_core.errors import GNQError
from gnq_core.results.store import Store
from gnq_core.results.store_queries import Run

MOSTLY = 0.5  # more than half the batches


class NumericalFailureError(GNQError, ValueError):
    """Most batches of a run were non-finite."""


def check_mostly_finite(store: Store, run: Run) -> None:
    finite = store.batches(run.run_id)["finite"]
    bad = int((~finite.astype(bool)).sum())
    if len(finite) and bad > MOSTLY * len(finite):
        raise NumericalFailureError(
            f"run {run.name!r}: {bad} of {len(finite)} batches were non-finite (NaN/Inf loss or gradients), "
            "so most GNQ values are missing; check the weights, the config, --lr and --dtype")
