"""A run's per-text signal frame: every score the predictive-power table can test against the
attack's outcome, one row per text (analysis.predictive names the columns it knows)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gnq_core.results.precision import precision_note
from gnq_core.results.store import Store
from gnq_core.results.store_queries import Run


def signal_frame(store: Store, run: Run, totals: pd.DataFrame | None = None) -> pd.DataFrame:
    """``totals`` (default: ``store.example_totals``; pass the verdict-ranked frame to test its
    risk too) plus the run's per-example metrics and, for an audit of a training run's
    checkpoints, that training run's in-run GNQ accumulated over every epoch
    (``gnq_inrun_total``).  For a training run, ``gnq_total`` already is the in-run GNQ."""
    frame = store.example_totals(run.run_id) if totals is None else totals.copy()
    frame = aligned_to_attack(frame, store.scores(run.run_id), store.points(run.run_id),
                              store.extractions(run.run_id))
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
    """Where the run's GNQ columns come from, in one sentence (and one more when the run's gradients
    were half precision)."""
    note = precision_note(run.settings)
    text = _source(store, run)
    return text if note is None else f"{text} Note: {note}."


def _source(store: Store, run: Run) -> str:
    if run.kind == "train":
        return (f"GNQ was computed in-run while run {run.name!r} trained: GNQ_total is the in-run "
                "accumulated GNQ.")
    source = store.training_run_of(run.run_id)
    text = f"GNQ was computed post hoc over run {run.name!r}'s checkpoints"
    if source is not None:
        return text + (f"; GNQ in-run (accumulated) comes from the training run {source.name!r} that "
                       "saved them.")
    return text + "; no in-run training run of these checkpoints is in the store."


AT_POINT = ["gnq_total", "gnq_max", "gnq_mean", "gnq_last", "loss_last", "self_influence_last", "min_k_plus",
            "n_points"]


def aligned_to_attack(frame: pd.DataFrame, scores: pd.DataFrame, points: pd.DataFrame,
                      attacks: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with the per-point signals read at the attacked point: when ``gnq extract
    --checkpoint`` attacked an earlier point than the run's last finished one, GNQ_total/max/mean
    sum over the points up to the attacked one and GNQ_last, loss, K_jj and Min-K%++ are its values there
    (the attacked model's, not a later one's).  ``signals_point`` names the point read (NaN: no
    attack, the last point's values stay)."""
    done = points[points["status"] == "done"]
    if attacks.empty or done.empty or scores.empty:
        return frame.assign(signals_point=np.nan)
    attacked = int(attacks["point"].iloc[0])
    label = done.set_index("point")["label"].get(attacked, attacked)
    if attacked >= int(done["point"].max()):
        return frame.assign(signals_point=label)
    upto = scores[scores["point"].isin(done["point"]) & (scores["point"] <= attacked)]
    by = upto.groupby("example_id")
    at = upto[upto["point"] == attacked].set_index("example_id")
    values = pd.DataFrame({"gnq_total": by["gnq"].sum(min_count=1), "gnq_max": by["gnq"].max(),
                           "gnq_mean": by["gnq"].mean(), "n_points": by["gnq"].count()})
    values["gnq_last"], values["loss_last"] = at["gnq"], at["loss"]
    values["self_influence_last"] = at["self_influence"]
    if "min_k_plus" in at.columns:
        values["min_k_plus"] = at["min_k_plus"]
    out = frame.drop(columns=[c for c in AT_POINT if c in frame.columns])
    out = out.merge(values.reset_index(), on="example_id", how="left")
    return out.assign(signals_point=label)
