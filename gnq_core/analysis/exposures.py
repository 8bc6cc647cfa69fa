"""What a run's secret exposures say, for the report (HTML and JSON), the Runs page and the
Flagged texts' detail: one row per distinct value (attacks/secret_exposure.py) and, per format,
the null of never-trained values with the threshold's false-alarm rate on it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from gnq_core.catalog import RELATIVE_TEMPLATE
from gnq_core.results.store import Store

VALUE_COLUMNS = ["kind", "value", "template", "copies", "exposure", "method", "rank", "space_bits", "nodes",
                 "candidates", "fit", "reference_exposure", "reference_method", "reference_rank", "null_p99",
                 "exposed", "leaked", "p_value", "log_ratio", "reference_ratio_p", "fdr_q"]


# a value's exposure columns as the Flagged texts' detail shows them (secret_attacks' names)
EXPOSURE_SHOWN = ["exposure", "exposure_method", "exposure_rank", "exposure_template", "reference_exposure",
                  "exposure_null_p99", "exposed", "value_copies"]


def exposed(values: pd.DataFrame) -> pd.Series:
    """Which distinct secret values (rows of ``Store.secret_values``) count as exposed: the one rule
    every count of exposed values reads (the JSON's ``secret_exposure.exposed`` and
    ``verdict.counts.values_exposed``, the Runs page's tile and expander, the HTML report), so a change
    of the rule changes them all.  Today: the attack's flag (attacks/secret_exposure.py), exposure
    its p-value survives Benjamini–Hochberg at the run's q (and, with a reference model, its
    likelihood ratio beats never-trained values'; attacks/exposure_fdr.py), or on rows attacked before
    that, above the never-trained values' 99th percentile and the reference's; not measured: not
    exposed."""
    if "exposed" not in values:
        return pd.Series(False, index=values.index)
    return values["exposed"].astype("boolean").fillna(False).astype(bool)


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
    values["rank_estimate"] = [estimated_rank(r) for r in values.to_dict(orient="records")]
    n_exposed = int(exposed(values).sum())
    q = values["fdr_q"].dropna()
    fdr = float(q.iloc[0]) if len(q) else None  # None: decided before "exposed" had a false-discovery rate
    return {"values": values.to_dict(orient="records"), "formats": formats,
            "distinct_values": len(values), "not_measured": int((~measured).sum()), "exact": exact,
            "estimated": int((values["method"] == "estimated").sum()),
            "exact_share": exact / int(measured.sum()) if measured.any() else None,
            "exposed": n_exposed, "fdr_q": fdr, "tested": int(values["p_value"].notna().sum()),
            "expected_false": expected_false(n_exposed, fdr) if fdr is not None else None,
            "reference_test": bool(values["reference_ratio_p"].notna().any())}


def expected_false(exposed: int, q: float) -> float:
    """At most how many of ``exposed`` values called exposed at false-discovery rate ``q`` are
    expected to be false alarms: q × exposed (the Benjamini–Hochberg guarantee, E[false / exposed]
    ≤ q; attacks/exposure_fdr.py)."""
    return q * exposed


def fdr_sentence(summary: dict[str, Any]) -> str:
    """How "exposed" was decided on this run and how many of its calls are expected false."""
    if summary.get("fdr_q") is None:
        return ("Exposed = above the 99th percentile of never-trained values of its format and above the "
                "reference model's exposure (the rule before false-discovery control: no false-alarm rate "
                "across the run's values; attack again for one).")
    q, n, tested = summary["fdr_q"], summary["exposed"], summary["tested"]
    said = (f"Exposed = its p-value (the chance a never-trained value ranks as high: 2^−exposure for an "
            f"exact rank, an estimate's upper 95% bound) survives Benjamini–Hochberg at q = {q:g} across the "
            f"run's {tested} measured values")
    if summary.get("reference_test"):
        said += (", and its log-likelihood ratio audited/reference beats never-trained values of its format "
                 f"(likelihood-ratio p ≤ {q:g})")
    return said + (f". {n} exposed: at most {expected_false(n, q):.2f} of them expected to be false alarms "
                   f"(q × {n})." if n else ". None exposed: no false alarm among them.")


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


def estimated_rank(row: dict) -> float | None:
    """The rank an estimated exposure stands for, 2^(log2 |space| − exposure) (None for an exact
    rank, which ``rank`` holds, or a value not measured)."""
    bits, space = row.get("exposure"), row.get("space_bits")
    if row.get("method") != "estimated" or not _finite(bits) or not _finite(space):
        return None
    return float(2.0 ** (float(space) - float(bits)))


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _count(n: float) -> str:
    return f"{n:,.0f}" if n < 1e6 else f"2^{math.log2(n):.1f}"


def rank_words(row: pd.Series | dict, prefix: str = "") -> str:
    """"1 of 2^13.3 (exact)" or "≈ 430 of 2^46.5 (estimated)" for a value's row; ``prefix``:
    the reference model's columns ("reference_" before method and rank; the space is the same)."""
    method, rank, bits = row.get(f"{prefix}method"), row.get(f"{prefix}rank"), row.get("space_bits")
    if row.get("template") == RELATIVE_TEMPLATE and method == "estimated":
        share = 2.0 ** -float(row["exposure"]) if _finite(row.get("exposure")) else None
        said = f"{share:.2g}" if share is not None else "?"
        return f"top {said} of what the reference model writes (estimated)"
    size = f"2^{bits:.1f}" if _finite(bits) else "its space"
    if method == "exact" and pd.notna(rank):
        return f"{int(rank):,} of {size} (exact)"
    if method == "estimated":
        guess = estimated_rank({"method": method, "space_bits": bits,
                                "exposure": row.get(f"{prefix}exposure" if prefix else "exposure")})
        return f"≈ {_count(guess)} of {size} (estimated)" if guess is not None else f"of {size} (estimated)"
    return "not measured"


# What each column of ``values_table`` means: the Runs page's column help, the report's caption.
VALUES_HELP: dict[str, str] = {
    "format": "The value's template: # = a free digit (the part ranked), the other characters kept as "
              "written; e-mails, names, addresses and dates of birth, whose values are not equally likely, "
              f"read {RELATIVE_TEMPLATE}: measured against what the reference model writes after the same "
              "prompt.",
    "copies": "Texts holding this value: its copies share one computation and one number.",
    "exposure (bits)": "log2 of the number of values of its format − log2 of its rank among them by the "
                       "audited model's likelihood. The ceiling (rank 1) = the model prefers it to every "
                       "other value of its format; about 1.4 = a uniformly random rank. Relative to the "
                       "reference model: −log2 of the share of what the reference writes there whose "
                       "likelihood gained as much from this training (audited/reference), so a common name "
                       "is not exposed for being common.",
    "rank": "Its rank among all values of its format: exact (a pruned search found it) or estimated from "
            "random values when the search ran out of nodes (the fit is in the last column and the JSON).",
    "reference (bits)": "The same exposure under the reference model (the base model or the run's first "
                        "checkpoint): what the value is worth without this training.",
    "reference rank": "The reference model's rank of the value, exact or estimated.",
    "never-trained 99th pct (bits)": "99th percentile of the exposure of values of the same format the "
                                     "model never saw (the run's control: how far such values reach, "
                                     "estimates included; no longer the threshold).",
    "p-value": "The chance that a value the model never trained on ranks at least this high: rank / size "
               "of its format = 2^−exposure (an estimated rank: at its upper 95% bound).",
    "reference LR p": "Likelihood-ratio test against the reference model: the share of never-trained values "
                      "of its format whose log-likelihood gained as much from audited over reference.",
    "exposed": "yes: its p-value survives Benjamini–Hochberg at the run's q (false-discovery rate) across "
               "the run's values and, with a reference model, its reference LR p is at most q.",
    "leaked": "yes: the model writes the value whole when prompted with its text (and the reference does "
              "not).",
    "fit": "How an estimated rank was found: the distribution fitted to random values' likelihoods.",
}


def values_table(summary: dict[str, Any], fit: bool = True) -> pd.DataFrame:
    """The per-value rows as a readable table (the report's and the Runs page's; ``fit``: the
    estimate's fit as the last column, left to the JSON in the report). Column help: VALUES_HELP."""
    rows = pd.DataFrame(summary["values"], columns=VALUE_COLUMNS)
    if rows.empty:
        return rows
    records = rows.to_dict(orient="records")
    table = pd.DataFrame({  # the three numbers compared and the outcome first: they fit a page's width
        "kind": rows["kind"], "value": rows["value"],
        "exposure (bits)": rows["exposure"].astype(float).round(2),
        "reference (bits)": rows["reference_exposure"].astype(float).round(2),
        "p-value": rows["p_value"].astype(float).map(_p_words),
        "reference LR p": rows["reference_ratio_p"].astype(float).map(_p_words),
        "exposed": [_yes_no(v) for v in rows["exposed"]], "leaked": [_yes_no(v) for v in rows["leaked"]],
        "never-trained 99th pct (bits)": rows["null_p99"].astype(float).round(2),
        "rank": [rank_words(r) for r in records],
        "reference rank": [rank_words(r, "reference_") for r in records],
        "format": rows["template"], "copies": rows["copies"]})
    if fit:
        table["fit"] = rows["fit"].where(rows["fit"].notna(), "")
    return table


def _p_words(p: float) -> str:
    return "" if not math.isfinite(p) else (f"{p:.2g}" if p >= 1e-4 else f"2^{math.log2(p):.1f}")


def _yes_no(value: object) -> str:
    return "" if value is None or pd.isna(value) else ("yes" if bool(value) else "no")


def null_sentence(fmt: dict[str, Any]) -> str:
    """One format's never-trained control in words: its spread, the threshold and the threshold's
    false-alarm rate on it (and for a uniformly random rank)."""
    if not fmt["null_values"]:
        return f"{fmt['kind']} {fmt['template']}: no never-trained value could be measured."
    said = (f"{fmt['kind']} {fmt['template']}: {fmt['null_values']} values the model never saw score median "
            f"{fmt['null_median']:.1f} bits, at most {fmt['null_max']:.1f}")
    if fmt["null_estimated"]:
        said += f" ({fmt['null_estimated']} of them estimated)"
    if fmt["threshold"] is not None:
        over = round(fmt["false_alarm_null"] * fmt["null_values"])
        said += (f"; {over} of these {fmt['null_values']} ({fmt['false_alarm_null']:.0%}) exceed their 99th "
                 f"percentile, {fmt['threshold']:.1f} bits, which a uniformly random rank would "
                 f"{fmt['false_alarm_uniform']:.1%} of the time")
    return said + "."


# the secret attack's exposure columns (EXPOSURE_SHOWN) and the VALUES_HELP entry that explains each
SHOWN_HELP = {"exposure": "exposure (bits)", "exposure_method": "rank", "exposure_rank": "rank",
              "exposure_template": "format", "reference_exposure": "reference (bits)",
              "exposure_null_p99": "never-trained 99th pct (bits)", "exposed": "exposed",
              "value_copies": "copies"}


def value_exposure_sentence(row: pd.Series | dict) -> str:
    """One attacked value's exposure in words, every number with what it is measured against
    (``row``: a ``Store.secret_attacks`` row): its rank, exact or estimated, the reference
    model's, and its format's never-trained 99th percentile."""
    value = row.get("value")
    if not _finite(row.get("exposure")):
        return (f"{value}: exposure not measured (a value is ranked among the values of its format's free "
                "characters; an e-mail, name, address or date of birth only against a reference model).")
    same = {"space_bits": row.get("exposure_space_bits"), "template": row.get("exposure_template")}
    mine = rank_words(same | {"method": row.get("exposure_method"), "rank": row.get("exposure_rank"),
                              "exposure": row.get("exposure")})
    said = f"{value}: exposure {float(row['exposure']):.1f} bits, rank {mine}"
    if _finite(row.get("reference_exposure")):
        theirs = rank_words(same | {"method": row.get("reference_exposure_method"),
                                    "rank": row.get("reference_exposure_rank"),
                                    "exposure": row.get("reference_exposure")})
        said += f"; under the reference model {float(row['reference_exposure']):.1f} bits, rank {theirs}"
    if _finite(row.get("exposure_null_p99")):
        p99 = float(row["exposure_null_p99"])
        said += f"; values of its format the model never saw: 99th percentile {p99:.1f} bits"
    if _finite(row.get("exposure_p")):
        said += f"; p-value {_p_words(float(row['exposure_p']))}"
        if _finite(row.get("reference_ratio_p")):
            said += f", reference likelihood-ratio p {_p_words(float(row['reference_ratio_p']))}"
    exposed = row.get("exposed")
    if exposed is not None and not pd.isna(exposed):
        said += " → exposed" if bool(exposed) else " → not exposed"
        if _finite(row.get("exposure_fdr_q")):
            said += f" (Benjamini–Hochberg at q = {float(row['exposure_fdr_q']):g} across the run's values)"
    return said + "."
