"""What a run's secret exposures say, for the report (HTML and JSON), the Runs page and the
Flagged texts' detail: one row per distinct value (pipelines/secret_exposure.py) and, per format,
the null of never-trained values with the threshold's false-alarm rate on it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from gnq_core.results.store import Store

VALUE_COLUMNS = ["kind", "value", "template", "copies", "exposure", "method", "rank", "space_bits", "nodes",
                 "candidates", "fit", "reference_exposure", "reference_method", "reference_rank", "null_p99",
                 "exposed", "leaked"]


# a value's exposure columns as the Flagged texts' detail shows them (secret_attacks' names)
EXPOSURE_SHOWN = ["exposure", "exposure_method", "exposure_rank", "exposure_template", "reference_exposure",
                  "exposure_null_p99", "exposed", "value_copies"]


def exposure_summary(store: Store, run_id: int) -> dict[str, Any]:
    """{"values": per distinct value, "formats": per format its null and threshold, "exact_share":
    the share of the measured values whose rank is exact, "estimated": how many were estimated,
    "not_measured": values whose likelihoods were not finite}."""
    values = store.secret_values(run_id).reindex(columns=VALUE_COLUMNS)
    null = store.secret_exposure_null(run_id)
    formats = []
    for (kind, template), group in null.groupby(["kind", "template"], sort=True):
        bits = [float(b) for b in group["exposure"].dropna()]
        mine = values[(values["kind"] == kind) & (values["template"] == template)]
        threshold = float(mine["null_p99"].dropna().iloc[0]) if mine["null_p99"].notna().any() else None
        formats.append({"kind": kind, "template": template, "values": len(mine),
                        "null_exposures": sorted(round(b, 3) for b in bits),
                        "null_median": float(np.median(bits)) if bits else None,
                        "null_max": max(bits) if bits else None,
                        "null_estimated": int((group["exposure_method"] == "estimated").sum()),
                        **false_alarm(bits, threshold)})
    measured = values["method"].notna()
    exact = int((values["method"] == "exact").sum())
    return {"values": values.to_dict(orient="records"), "formats": formats,
            "distinct_values": len(values), "not_measured": int((~measured).sum()), "exact": exact,
            "estimated": int((values["method"] == "estimated").sum()),
            "exact_share": exact / int(measured.sum()) if measured.any() else None,
            "exposed": int(values["exposed"].fillna(False).astype(bool).sum())}


def false_alarm(null_bits: Sequence[float], threshold: float | None) -> dict:
    """The threshold's false-alarm rate: on the run's null (share strictly above it) and, for
    exact ranks, in theory (a uniform rank exceeds t bits with probability 2^−t)."""
    bits = [b for b in null_bits if b is not None and not (isinstance(b, float) and math.isnan(b))]
    if threshold is None or not bits:
        return {"null_values": len(bits), "threshold": threshold, "false_alarm_null": None,
                "false_alarm_uniform": None}
    return {"null_values": len(bits), "threshold": threshold,
            "false_alarm_null": float(np.mean([b > threshold for b in bits])),
            "false_alarm_uniform": float(2.0 ** -threshold)}


def rank_words(row: pd.Series | dict) -> str:
    """"rank 1 of 10^4 (exact)" or "estimated" with its exposure's basis, for a value's row."""
    method, bits = row.get("method"), row.get("space_bits")
    size = f"2^{bits:.1f}" if isinstance(bits, float) and math.isfinite(bits) else "its space"
    if method == "exact" and pd.notna(row.get("rank")):
        return f"rank {int(row['rank']):,} of {size} (exact)"
    if method == "estimated":
        return f"estimated among {size} ({row.get('fit')})"
    return "not measured"


def values_table(summary: dict[str, Any]) -> pd.DataFrame:
    """The per-value rows as a readable table (the report's and the Runs page's)."""
    rows = pd.DataFrame(summary["values"], columns=VALUE_COLUMNS)
    if rows.empty:
        return rows
    return pd.DataFrame({
        "kind": rows["kind"], "value": rows["value"], "template": rows["template"], "copies": rows["copies"],
        "exposure (bits)": rows["exposure"].astype(float).round(2),
        "rank": [rank_words(r) for r in rows.to_dict(orient="records")],
        "reference (bits)": rows["reference_exposure"].astype(float).round(2),
        "null 99th pct (bits)": rows["null_p99"].astype(float).round(2),
        "exposed": rows["exposed"], "leaked": rows["leaked"]})


def null_sentence(fmt: dict[str, Any]) -> str:
    """One format's null in words."""
    if not fmt["null_values"]:
        return f"{fmt['kind']} {fmt['template']}: no never-trained value could be measured."
    said = (f"{fmt['kind']} {fmt['template']}: {fmt['null_values']} never-trained values score median "
            f"{fmt['null_median']:.1f} bits, at most {fmt['null_max']:.1f}")
    if fmt["null_estimated"]:
        said += f" ({fmt['null_estimated']} of them estimated)"
    if fmt["threshold"] is not None:
        said += (f"; exposed above {fmt['threshold']:.1f} bits, which {fmt['false_alarm_null']:.0%} of them "
                 f"exceed (a uniform rank: {fmt['false_alarm_uniform']:.1%})")
    return said + "."
