"""A run's per-text signal frame: every score the predictive-power table can test against the
attack's outcome, one row per text (analysis.predictive names the columns it knows)."""

from __future__ import annotations

import pandas as pd

from gnq_core.results.store import Run, Store


def signal_frame(store: Store, run: Run, totals: pd.DataFrame | None = None) -> pd.DataFrame:
    """``totals`` (default: ``store.example_totals``; pass the verdict-ranked frame to test its
    risk too) plus the run's per-example metrics and, for an audit of a training run's
    checkpoints, that training run's in-run GNQ accumulated over every epoch
    (``gnq_inrun_total``).  For a training run, ``gnq_total`` already is the in-run GNQ."""
    frame = store.example_totals(run.run_id) if totals is None else totals.copy()
    metrics = store.metrics(run.run_id)
    extra = [c for c in metrics.columns if c != "example_id" and c not in frame.columns]
    if extra:
        frame = frame.merge(metrics[["example_id", *extra]], on="example_id", how="left")
    if run.kind != "train":
        source = store.training_run_of(run.run_id)
        if source is not None:
            inrun = store.example_totals(source.run_id)[["example_id", "gnq_total"]]
            frame = frame.merge(inrun.rename(columns={"gnq_total": "gnq_inrun_total"}), on="example_id",
                                how="left")
    return frame


def gnq_provenance(store: Store, run: Run) -> str:
    """Where the run's GNQ columns come from, in one sentence."""
    if run.kind == "train":
        return (f"GNQ was computed in-run while run {run.name!r} trained: GNQ_total is the in-run "
                "accumulated GNQ.")
    source = store.training_run_of(run.run_id)
    text = f"GNQ was computed post hoc over run {run.name!r}'s checkpoints"
    if source is not None:
        return text + (f"; GNQ in-run (accumulated) comes from the training run {source.name!r} that "
                       "saved them.")
    return text + "; no in-run training run of these checkpoints is in the store."
