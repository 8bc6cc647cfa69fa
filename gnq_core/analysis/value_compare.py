"""Was the fix verified? Each secret value of a first run, its status and exposure there and in a
second run over the same texts (the original data audited against the model retrained on the
cleaned file), and which values the second model still writes.

Values are matched by kind and value (Store.value_outcomes of each run).  A value the second run
did not probe (its texts do not hold it: a run trained and audited on the cleaned file) is said to
be so, never counted as fixed: audit the original data against the retrained checkpoints
(``gnq audit --checkpoints RETRAINED --data ORIGINAL``, then ``gnq extract``) and compare with that
run.
"""

from __future__ import annotations

import pandas as pd

from gnq_core.analysis.verdict import LEAKED, PARTLY

EXPOSED, NOT_LEAKED, NOT_PROBED = "exposed", "not leaked", "not probed"
STILL, FIXED, UNPROBED = "still reproduced", "fixed", "not verified"
STILL_EXPOSED, NEITHER = "still exposed", "not leaked in either"
VALUE_COLUMNS = ["kind", "value", "shown", "text_id", "status_before", "exposure_before", "status_after",
                 "exposure_after", "null_p99_after", "still_reproduced", "verdict"]
VALUE_CHANGE_HELP = {
    "status_before": "The value's status in the first run: leaked (written whole, calibrated), partly "
                     "leaked, exposed (above never-trained values of its format and the reference), not "
                     "leaked.",
    "status_after": "The same in the second run; 'not probed': the second run's texts do not hold it (audit "
                    "the original data against the retrained model to verify it).",
    "exposure_before": "Bits: log2 of the value's space − log2 of its rank by the model's likelihood; ≈ 0 "
                       "for a value the model has not learned, up to the space's size for a memorised one.",
    "verdict": "still reproduced: the second model writes it whole or in part (act on it again); "
               "still exposed: not written, but above never-trained values; fixed: out or exposed in the "
               "first run, probed in the second and neither; not leaked in either; not verified: not probed "
               "in the second run.",
}


def value_status(row: pd.Series) -> str:
    """One value's status in words from its Store.value_outcomes row."""
    if bool(row.get("leaked")):
        return LEAKED
    if _true(row.get("partly")):
        return PARTLY
    if _true(row.get("exposed")):
        return EXPOSED
    return NOT_LEAKED


def _true(value: object) -> bool:
    return bool(pd.notna(value) and value)


def masked(value: str) -> str:
    """The value with its letters and digits hidden but the last two ("•••• •••• •••• ••21"), for
    a terminal or a log; separators kept so its format stays readable."""
    places = [i for i, c in enumerate(value) if c.isalnum()]
    shown = set(places[-2:]) if len(places) > 4 else set()
    return "".join(c if (not c.isalnum() or i in shown) else "•" for i, c in enumerate(value))


def value_changes(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """Per value of ``before`` (its Store.value_outcomes), in its order: ``VALUE_COLUMNS``."""
    later = {(str(r["kind"]), str(r["value"])): r for _, r in after.iterrows()}
    rows = []
    for _, r in before.iterrows():
        key = (str(r["kind"]), str(r["value"]))
        a = later.get(key)
        status_after = value_status(a) if a is not None else NOT_PROBED
        still = status_after in (LEAKED, PARTLY)
        verdict = (STILL if still else UNPROBED if a is None else STILL_EXPOSED if status_after == EXPOSED
                   else FIXED if value_status(r) != NOT_LEAKED else NEITHER)
        rows.append({"kind": key[0], "value": key[1], "shown": masked(key[1]),
                     "text_id": int(r["first_example"]),
                     "status_before": value_status(r), "exposure_before": r.get("exposure"),
                     "status_after": status_after,
                     "exposure_after": a.get("exposure") if a is not None else None,
                     "null_p99_after": a.get("null_p99") if a is not None else None,
                     "still_reproduced": still, "verdict": verdict})
    frame = pd.DataFrame(rows, columns=VALUE_COLUMNS)
    return frame.astype({c: "Float64" for c in ("exposure_before", "exposure_after", "null_p99_after")})


def changes_summary(frame: pd.DataFrame) -> str:
    """One sentence: how many values were fixed, are still reproduced, exposed, or not verified."""
    if frame.empty:
        return "The first run has no attacked secret value to verify."
    n = frame["verdict"].value_counts()
    parts = [f"{n.get(FIXED, 0)} of {len(frame)} value(s) fixed (out or exposed before; probed after, "
             "neither written nor exposed)"]
    if n.get(STILL, 0):
        parts.append(f"{n[STILL]} still reproduced")
    if n.get(STILL_EXPOSED, 0):
        parts.append(f"{n[STILL_EXPOSED]} not written but still exposed")
    if n.get(NEITHER, 0):
        parts.append(f"{n[NEITHER]} out or exposed in neither run")
    if n.get(UNPROBED, 0):
        parts.append(f"{n[UNPROBED]} not probed in the second run (its texts do not hold them: audit the "
                     "original data against the retrained checkpoints, then gnq extract, and compare with "
                     "that run)")
    return "; ".join(parts) + "."
