"""Everything ``gnq report`` states about a run, computed once (one computation, several views):
the HTML report, ``gnq report --json`` and the dashboard's Extraction and Runs pages read it.

``RunReport.to_json()`` follows the schema ``gnq-report/2`` (docs/DESIGN.md §8, "The report's
JSON"): provenance (λ, loss convention, batch size, seed, model and dataset identity, code
version, attack rule), what GNQ is on this run, the record-level GNQ of each copy cluster, and
one row per outcome × unit × signal × scope of analysis.evidence.  Version 2 (copies counted once): every
row states its ``unit`` (texts or records: copies collapsed), ``independent_positives`` (and
negatives: records, copies once), ``too_few`` (then no estimate, only the note), and its
intervals resample copy clusters.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from gnq_core.analysis import clusters as cl
from gnq_core.analysis import evidence as ev
from gnq_core.analysis import gnq_nature
from gnq_core.analysis import predictive as pr
from gnq_core.analysis.counts import run_counts
from gnq_core.analysis.exposures import exposure_summary
from gnq_core.analysis.findings import summary
from gnq_core.analysis.risk import RiskBasis, risk_components
from gnq_core.analysis.signals import gnq_provenance, signal_frame
from gnq_core.analysis.verdict import rank_texts
from gnq_core.common.atomic import write_text_atomic
from gnq_core.results.store import Store
from gnq_core.results.store_queries import Run

SCHEMA = "gnq-report/2"


@dataclass
class RunReport:
    run: Run
    provenance: list[tuple[str, Any]]
    frame: pd.DataFrame              # the evidence frame (analysis.evidence's contract)
    evidence: pd.DataFrame           # evidence.evidence_table
    nature: dict                     # gnq_nature.summary
    records: pd.DataFrame            # gnq_nature.record_gnq
    gnq_source: str                  # where the GNQ columns come from, in words
    risk: RiskBasis                  # which components the verdict's risk uses, and why
    resamples: int
    seed: int
    level: float = pr.LEVEL
    counts: dict[str, Any] = field(default_factory=dict)  # analysis.counts: the pages' numbers
    summary: str = ""                # findings.summary: the pages' headline
    exposure: dict = field(default_factory=dict)  # analysis.exposures: per distinct secret value
    generated: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    def to_json(self) -> dict[str, Any]:
        """The JSON document (schema ``SCHEMA``); NaN becomes null."""
        return _clean({
            "schema": SCHEMA,
            "generated": self.generated,
            "run": {"name": self.run.name, "id": self.run.run_id, "kind": self.run.kind,
                    "texts": self.run.n_examples},
            "provenance": {k: v for k, v in self.provenance},
            "method": {"evidence": ev.method(self.resamples, self.seed, self.level),
                       "resamples": self.resamples, "seed": self.seed, "level": self.level,
                       "fpr_levels": list(ev.FPR_LEVELS), "gnq_source": self.gnq_source,
                       "units": list(cl.UNITS), "min_records": cl.MIN_RECORDS},
            "gnq_on_this_run": {k: v for k, v in self.nature.items()},
            "verdict": {"risk_basis": self.risk.words, "risk_label": self.risk.label,
                        "risk_components": list(self.risk.components),
                        "risk_ground_truth": self.risk.ground_truth, "risk_calibrated": self.risk.calibrated,
                        "risk_auc": self.risk.auc,
                        "risk_auc_interval": list(self.risk.auc_interval) if self.risk.auc_interval else None,
                        "summary": self.summary, "counts": self.counts},
            "record_gnq": self.records.to_dict(orient="records"),
            "secret_exposure": self.exposure,
            "tables": [_row(r) for r in self.evidence.to_dict(orient="records")],
        })


def _row(r: dict) -> dict:
    """One evidence row as JSON: estimates as {value, lo, hi}; only the numbers its scope has."""
    keys = ("outcome", "positive", "unit", "signal", "label", "direction", "scope", "n", "positives")
    out = {k: r[k] for k in keys}
    out["independent_positives"] = r["records"]
    out["independent_negatives"] = r["negative records"]
    out["too_few"] = isinstance(r.get("note"), str) and r["note"].startswith(cl.TOO_FEW)
    if r["scope"] in (ev.SCOPE_ALL, ev.SCOPE_LENGTH):
        out["auc"] = _est(r, "auc")
    if r["scope"] == ev.SCOPE_ALL:
        out["tpr_at_fpr"] = {f"{a:g}": _est(r, f"tpr@{a:g}") for a in ev.FPR_LEVELS}
    if r["scope"] == ev.SCOPE_LENGTH:
        out |= {k: None if pd.isna(r[k]) else int(r[k]) for k in ("strata", "pairs")}
    if r["scope"] == ev.SCOPE_GAIN:
        out |= {"cv_auc_gain": _est(r, "gain"), "auc_base": r["auc base"], "auc_full": r["auc full"],
                "lr_p": r["lr p"], "base": r["base"]}
    if isinstance(r.get("note"), str):
        out["note"] = r["note"]
    return out


def _est(r: dict, key: str) -> dict:
    return {"value": r.get(key), "lo": r.get(f"{key} lo"), "hi": r.get(f"{key} hi")}


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/NA → None, numpy scalars → Python."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()
    if value is None or value is pd.NA or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return value


def provenance(store: Store, run: Run, attacks: pd.DataFrame) -> list[tuple[str, Any]]:
    """What produced the run: (field, value) pairs, shown as the report's provenance table and
    written to its JSON."""
    points = store.points(run.run_id)
    done = points[points["status"] == "done"]
    info = store.runs()
    row = info[info["run_id"] == run.run_id].iloc[0]
    fields: list[tuple[str, Any]] = [
        ("kind", run.kind), ("status", run.status), ("texts", run.n_examples),
        ("points done", f"{len(done)} of {len(points)}" + (f" ({', '.join(done['label'].astype(str))})"
                                                          if 0 < len(done) <= 40 else "")),
        ("λ", run.lam), ("λ mode", run.settings.get("lam_mode", "absolute")),
        ("loss convention", row.get("loss_convention")),
        ("batch size", run.batch_size), ("seed", run.seed), ("max length (tokens)", run.max_length),
        ("model", run.model_path), ("model hash", row.get("model_hash")), ("dataset", run.dataset_path),
        ("dataset hash", run.dataset_hash), ("code version", row.get("code_version")),
        ("device", row.get("device")), ("dtype", row.get("dtype")),
        ("mixed precision", run.settings.get("mixed_precision", "no")),
        ("created", str(row.get("created_at"))), ("updated", str(row.get("updated_at"))),
    ]
    if not attacks.empty:
        latest = attacks.sort_values("created_at").iloc[-1]
        label = points.set_index("point")["label"].get(latest["point"], latest["point"])
        rule = (f"checkpoint {label}, reveal {int(latest['prefix_tokens'])} tokens, greedy decoding, "
                f"success at match ≥ {latest['threshold']:g}")
        if pd.notna(latest.get("suffix_tokens")):
            rule += f" over exactly {int(latest['suffix_tokens'])} suffix tokens"
        if "reference_match" in attacks.columns and attacks["reference_match"].notna().any():
            rule += "; extracted only if the reference model does not reproduce it too"
        fields.append(("attack", rule))
        fields.append(("signals read at", f"point {label} (the attacked one)"))
    fields.append(("settings", json.dumps(run.settings, sort_keys=True, default=str)))
    return fields


def build(store: Store, run: Run, *, totals: pd.DataFrame | None = None, resamples: int = pr.RESAMPLES,
          seed: int = 0, cv: bool = True, membership: pd.DataFrame | None = None) -> RunReport:
    """The run's report data.  ``totals``: the verdict-ranked frame (default: ``rank_texts`` of the
    run's totals, so its risk is scored with the rest).  ``membership``: members and non-members
    at one checkpoint (``attacks.non_members.membership_frame``, both sides measured the same
    way), scored as the membership outcome beside the run's own rows (``with_membership``)."""
    if totals is None:
        totals = rank_texts(store.example_totals(run.run_id), membership)
    basis = totals.attrs.get("risk")
    if basis is None:  # a frame ranked elsewhere: what the run's risk is, again
        basis = risk_components(store.example_totals(run.run_id), membership).attrs["risk"]
    basis = RiskBasis.from_dict(basis)
    frame = signal_frame(store, run, totals)
    attacks = store.extractions(run.run_id)
    scores = store.scores(run.run_id)
    done = store.points(run.run_id)
    scores = scores[scores["point"].isin(done.loc[done["status"] == "done", "point"])]
    nature = gnq_nature.summary(scores, run.lam, run.settings.get("lam_mode", "absolute"))
    # without a cluster_id column every text is unique (NaN): no record of copies
    records = gnq_nature.record_gnq(scores, frame.reindex(columns=["example_id", "cluster_id"]))
    scored = frame if membership is None else ev.with_membership(frame, membership)
    table = ev.evidence_table(scored, resamples=resamples, seed=seed, cv=cv)
    exposure = exposure_summary(store, run.run_id)  # its exposed count is also verdict.counts.values_exposed
    counts = run_counts(totals, exposure)
    return RunReport(run=run, provenance=provenance(store, run, attacks), frame=frame, evidence=table,
                     nature=nature, records=records, gnq_source=gnq_provenance(store, run), risk=basis,
                     resamples=resamples, seed=seed, counts=counts.to_dict(),
                     summary=summary(totals, counts) if "status" in totals else "", exposure=exposure)


def write_json(report: RunReport, out) -> None:
    """Write the JSON atomically (a temporary sibling, then a rename): never half-written."""
    write_text_atomic(out, json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n")
