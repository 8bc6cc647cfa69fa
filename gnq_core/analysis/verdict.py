"""One ranking of a run's texts with a reason a user can act on.

What each signal means, and so how they combine (no weights fitted to any data set):

* **The attack's outcome** (``extracted``, calibrated: the audited model reproduces the text's
  continuation and the reference model does not) is not a prediction but the event itself: a
  text the model emits verbatim has leaked.  Leaked texts come first.
* **Secret-like content** (``secret``) says how much a leak would hurt, not how likely it is:
  a card number matters even if it has not leaked yet.  Among the rest, such texts come next.
* **Memorisation risk** (``risk`` in [0, 1], analysis/risk.py) orders everything else: how
  strongly the measurements point to the model having encoded the text, before any attack, from
  the components whose direction holds on evidence (calibrated membership, repetition), and GNQ
  or K_jj only where the run's own ground truth (extraction, or never-trained texts) validates
  them, in the direction it measures.  ``risk`` leaves the attack's outcome out, so it can be
  scored against that outcome; ``risk_basis`` says what it is on the run, in words, and
  ``risk_label`` in a few ("loss-only, uncalibrated" without a reference model or ground truth).

**Status** (the secret decides), one vocabulary for every page, the report and the
export (``STATUSES``, most severe first):

* ``leaked`` — for a text with a secret-like value: the model writes a value whole (every letter
  and digit, calibrated) when prompted with the text up to it; for a text without one: the text
  attack extracts its window;
* ``partly leaked`` — a value did not come out whole, but part of it did (results.store_schema
  ``partly_leaked``: at least 3 characters of its free part, the part neither the run's template
  nor its kind's format fixes, beyond what a never-trained value of the template matches, and
  more than the reference);
* ``text reproduced`` — a text with a secret-like value whose window comes out while no value
  does (or no value was attacked): the window cannot say the secret leaked;
* ``secret`` — secret-like content, none of it out;
* ``at risk`` — memorisation risk in this run's top 20%;
* ``public`` — marked public by the user (``--public-column``): nothing private to leak;
* ``low`` — none of these.

The order follows the statuses (leaked texts with a secret first), each by ``risk``:
``verdict_score`` = the status's tier (``TIERS``) + risk encodes exactly that.  ``rank`` 1 is the
text to look at first; ``percentile`` 100 is the top of the list.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gnq_core.analysis.clusters import bool_col, numeric_column
from gnq_core.analysis.risk import risk_components
from gnq_core.catalog import SIGNALS as CATALOG_SIGNALS
from gnq_core.catalog import SecretKind
from gnq_core.catalog import kind as secret_kind
from gnq_core.sources.value_match import ValueMatch, compare

VERDICT_COLUMNS = ["rank", "percentile", "status", "reason", "risk", "verdict_score"]
LEAKED, PARTLY, REPRODUCED, SECRET, AT_RISK, PUBLIC, LOW = (
    "leaked", "partly leaked", "text reproduced", "secret", "at risk", "public", "low")
STATUSES = (LEAKED, PARTLY, REPRODUCED, SECRET, AT_RISK, LOW, PUBLIC)
# verdict_score = tier + risk (risk in [0, 1]): a leaked text with a secret above one without
TIERS = {LEAKED: 6.0, PARTLY: 4.0, REPRODUCED: 3.0, SECRET: 2.0, AT_RISK: 0.0, LOW: 0.0, PUBLIC: -2.0}

# What every column means, for tooltips, captions and the exported data's documentation; a
# signal's is its catalog entry's (gnq_core/catalog/signals.py).
COLUMN_HELP: dict[str, str] = {s.column: s.help for s in CATALOG_SIGNALS} | {
    "rank": "Position in the verdict order: 1 = look at this text first. Leaked texts first (secret-like "
            "ones first), then other texts with secret-like content, then the rest by memorisation risk.",
    "percentile": "Share of this run's texts ranked at or below this one in the verdict order "
                  "(100 = the top of the list).",
    "status": "leaked: for a text with a secret-like value, the model writes a value whole when prompted "
              "with the text up to it (calibrated by the reference model); for any other text, the attack "
              "extracts its window. partly leaked: part of a value's secret part comes out (at least 3 of "
              "its free characters, those the run's template and the kind's format do not fix, beyond what "
              "a never-trained value of the template matches by chance, and more than the reference "
              "writes). text reproduced: the window of a text with a secret-like value comes out, the "
              "value does not. secret: secret-like content, none of it out. at risk: memorisation risk in "
              "this run's top 20%. public: marked public. low: none of these.",
    "reason": "Why the text sits where it does, in words.",
    "gnq_rank": "Rank by GNQ_total alone (1 = highest).",
    "gnq_percentile": "Share of this run's texts with GNQ_total at or below this one's (100 = highest).",
    "cluster_id": "The copy cluster (the smallest example id among the copies).",
    "gnq_with_copy": "Checkpoints or epochs at which the text's GNQ was measured with a copy of it in the "
                     "same batch: those GNQ values say nothing about the text (copies explain each other).",
    "secret": "Kinds of secret-like content found (card number with Luhn check, PIN, password, key, "
              "e-mail, phone...).",
    "secret_match": "The first secret-like string found (characters secret_start to secret_end).",
    "extraction_match": "Share of the suffix tokens the audited model reproduced after the prefix (1 = all).",
    "reference_match": "The same share for the reference model (the run's first checkpoint or the named "
                       "base model); if it also reproduces the text, the text is not counted as extracted.",
    "extracted": "The audited model reproduces the suffix exactly and the reference model does not "
                 "(empty: the text is too short to attack).",
    "secret_reproduced": "Prompted with the text up to one of its secret-like values, the audited model "
                         "writes every letter and digit of it and the reference model does not (empty: no "
                         "value attacked).",
    "secret_values": "Every secret-like value found in the text (JSON: kind, character spans, verified = "
                     "its checksum holds; false for a labelled card number or IBAN whose checksum fails).",
    "public": "Marked public by the user (--public-column): nothing private to leak.",
    "secret_values_attacked": "How many of the text's secret-like values the secret attack probed.",
    "secret_values_leaked": "How many of them the model writes whole (and the reference does not).",
    "secret_values_partly": "How many came out in part (at least 3 of their free characters, beyond what "
                            "never-trained values of the template match, more than the reference).",
    "secret_free_chars": "Letters and digits of the most exposed value that are its own: neither the run's "
                         "template nor its kind's format (a key's prefix, a check digit) fixes them.",
    "secret_free_chars_reproduced": "How many of those free characters the audited model wrote in place.",
    "secret_free_null_mean": "How many free characters the same writing matches of a never-trained value of "
                             "the same kind and template, on average (chance).",
    "secret_kind": "The kind of the text's most exposed value (the one secret_chars counts).",
    "secret_value": "The text's most exposed value: leaked, else partly leaked, else the most characters "
                    "written.",
    "secret_chars": "Letters and digits of the text's most exposed secret-like value (separators not "
                    "counted).",
    "secret_chars_reproduced": "How many of them the audited model wrote at their place.",
    "reference_secret_chars_reproduced": "How many of them the reference model wrote.",
    "secret_exposure": "Bits: log2 of the value's space (its free digits, the format's other characters "
                       "kept) − log2 of its rank there by likelihood; the text's most exposed value "
                       "(secret_exposure_value; digits only; the ceiling = more likely than every other "
                       "value of its space; about 1.4 = a uniformly random rank).",
    "secret_exposure_value": "The value secret_exposure, secret_exposed and the columns after them are about "
                             "(exposed first, else the most bits).",
    "secret_reference_exposure": "That value's exposure under the reference model (bits): what it is worth "
                                 "without this training.",
    "secret_exposure_null_p99": "99th percentile of the exposure of never-trained values of that value's "
                                "format (bits): the threshold for exposed, 1% false alarms.",
    "secret_exposed": "The value's exposure is above the 99th percentile of never-trained values of its "
                      "format (the run's null) and above the reference model's exposure of it.",
    "secret_exposure_estimated": "The rank behind the exposure was estimated from random values, not found "
                                 "exactly (the search's node budget ran out).",
    "secret_generated": "What the audited model wrote where the secret-like value stands.",
}


def rank_texts(totals: pd.DataFrame, membership: pd.DataFrame | None = None) -> pd.DataFrame:
    """``totals`` (Store.example_totals) plus rank, percentile, status, reason, risk and
    verdict_score, ordered by rank (ties by example_id).  ``membership``: the run's texts and
    never-trained ones (``attacks.non_members.membership_frame``), ground truth for the risk's
    components.  ``attrs``: ``risk_basis`` (words), ``risk_label`` (a few words) and ``risk``
    (analysis.risk.RiskBasis.to_dict())."""
    frame = totals.copy()
    if frame.empty:
        numeric = {"rank": "int64", "percentile": "float64", "risk": "float64", "verdict_score": "float64"}
        return frame.assign(**{c: pd.Series(dtype=numeric.get(c, object)) for c in VERDICT_COLUMNS})
    parts = risk_components(frame, membership)
    status = statuses(frame, parts["risk"])
    frame["risk"] = parts["risk"]
    frame["verdict_score"] = status.map(TIERS) + 1.0 * _has_secret(frame) + parts["risk"]
    order = frame.assign(_neg=-frame["verdict_score"]).sort_values(["_neg", "example_id"], kind="mergesort")
    n = len(frame)
    frame.loc[order.index, "rank"] = np.arange(1, n + 1)
    frame["rank"] = frame["rank"].astype(int)
    frame["percentile"] = 100.0 * (n - frame["rank"] + 1) / n
    frame["status"] = status
    frame["reason"] = [_reason(row, parts.loc[i], status) for (i, row), status in
                       zip(frame.iterrows(), frame["status"], strict=True)]
    out = frame.loc[order.index].reset_index(drop=True)
    basis = parts.attrs["risk"]
    out.attrs |= {"risk_basis": basis["words"], "risk_label": basis["label"], "risk": basis}
    return out


def _has_secret(frame: pd.DataFrame) -> pd.Series:
    return frame["secret"].notna() if "secret" in frame else pd.Series(False, index=frame.index)


def statuses(frame: pd.DataFrame, risk: pd.Series | None = None) -> pd.Series:
    """Each text's status (module docstring): the secret decides for a text with a secret-like
    value, the text attack's window for any other; ``risk`` (risk_components) for at risk."""
    public = bool_col(frame, "public")
    secret = _has_secret(frame) & ~public
    window = bool_col(frame, "extracted")
    values_leaked = bool_col(frame, "secret_reproduced") | (numeric_column(frame, "secret_values_leaked") > 0)
    partly = numeric_column(frame, "secret_values_partly") > 0  # NaN (not attacked) compares False
    risk = risk if risk is not None else risk_components(frame)["risk"]
    # risk 0 is no evidence at all (a run without any score): never "at risk" for that
    top_risk = (risk >= risk.quantile(0.8)) & (risk > 0) if len(risk) else pd.Series(False, index=frame.index)
    status = np.select(
        [public, secret & values_leaked, secret & partly, secret & window, secret, window, top_risk],
        [PUBLIC, LEAKED, PARTLY, REPRODUCED, SECRET, LEAKED, AT_RISK], LOW)
    return pd.Series(status, index=frame.index, dtype=object)


def value_outcome(extracted: object, chars: object, hits: object, reference_hits: object,
                  novel_hits: object = None, null_p: object = None) -> str:
    """One attacked value's outcome in the status words: leaked, partly leaked or not leaked."""
    from gnq_core.results.store_schema import partly_leaked

    if _true(extracted):
        return LEAKED
    ref = int(reference_hits) if pd.notna(reference_hits) else None
    novel = int(novel_hits) if novel_hits is not None and pd.notna(novel_hits) else None
    p = float(null_p) if null_p is not None and pd.notna(null_p) else None
    return PARTLY if partly_leaked(int(chars), int(hits), ref, novel, p) else "not leaked"


def flag(ranked: pd.DataFrame, *, top: int | None = None, min_percentile: float | None = None,
         min_gnq: float | None = None, group: str | None = None,
         statuses: tuple[str, ...] = ()) -> pd.DataFrame:
    """The texts to export from ``rank_texts``'s frame: filters combine (all must hold); the one
    filter type of ``gnq export`` and the Flagged page (analysis/flagging.py)."""
    from gnq_core.analysis.flagging import TextFilter, flagged

    return flagged(ranked, TextFilter(top=top, min_percentile=min_percentile, min_gnq=min_gnq,
                                      groups=() if group is None else (group,), statuses=statuses))


# ---------------------------------------------------------------------------------- reasons

def _true(value: object) -> bool:
    """True for a set, true flag (False for False, None, NA, NaN)."""
    return bool(pd.notna(value) and value)


def _share(p: float) -> str:
    """A within-run percentile (0-1, higher = stronger) in words."""
    for cut in (0.01, 0.05, 0.1, 0.2):
        if p >= 1 - cut:
            return f"in the top {cut:.0%}"
    return "in the bottom half" if p <= 0.5 else "mid-range"


def _reason(row: pd.Series, parts: pd.Series, status: str = "") -> str:
    clauses: list[str] = []
    prefix, suffix = row.get("attack_prefix_tokens"), row.get("attack_suffix_tokens")
    secret_clause = _secret_attack(row) if status != PUBLIC else ""
    if status == PUBLIC:
        out = " (its window comes out word for word)" if _true(row.get("extracted")) else ""
        clauses.append(f"marked public: nothing private to leak{out}")
    elif secret_clause:
        clauses.append(secret_clause)
    elif status == REPRODUCED:
        what = (f"its next {int(suffix)} tokens after the first {int(prefix)}" if pd.notna(suffix)
                else "its window")
        clauses.append(f"text reproduced: {what} come out word for word, but its secret-like value was not "
                       "attacked, so the window cannot say the value leaked")
    elif _true(row.get("extracted")):
        what = f"the next {int(suffix)} tokens" if pd.notna(suffix) else "the rest"
        ref = " (the reference model does not)" if pd.notna(row.get("reference_match")) else ""
        clauses.append(f"leaked: given its first {int(prefix)} tokens the model writes {what} "
                       f"word for word{ref}")
    elif _true(row.get("reproduced")) and pd.notna(row.get("extracted")):
        clauses.append("the model completes it, but so does the reference model: predictable, not a leak")
    if isinstance(row.get("secret"), str):
        kinds = [secret_kind(k).described for k in row["secret"].split(",")]
        clauses.append("contains " + " and ".join(kinds))
    copies = row.get("copies")
    if pd.notna(copies) and int(copies) > 1:
        if pd.notna(parts["gnq_percentile_valid"]):
            clauses.append(f"repeated {int(copies)}×: more chances to memorise it")
        else:
            clauses.append(f"repeated {int(copies)}×: copies explain each other, so GNQ cannot see it")
    text, strong = _evidence(row, parts, unique=not (pd.notna(copies) and int(copies) > 1), status=status)
    if status == "at risk" and not strong:  # the status's own ground, never "no strong sign" beside it
        clauses.append(f"memorisation risk in this run's top 20% (risk {parts['risk']:.2f}, "
                       f"{parts['risk_label']})")
    clauses.append(text)
    return "; ".join(c for c in clauses if c)


def row_kind(row: pd.Series) -> SecretKind:
    """The catalog's entry for the text's most exposed value's kind, else for its first kind's."""
    kind = row.get("secret_kind")
    return secret_kind(kind if isinstance(kind, str) else str(row.get("secret") or "").split(",")[0].strip())


def secret_words(row: pd.Series) -> str:
    """The text's most exposed value's kind in words ("the PIN"), else its first kind's."""
    return row_kind(row).the


def _exposure_clause(row: pd.Series, exposure: object) -> str:
    """"; exposure 13.3 bits (estimated), above never-trained values …" for a measured value; the
    value named when it is not the one the sentence before is about (another value of the text)."""
    if pd.isna(exposure):
        return ""
    how = " (estimated)" if _true(row.get("secret_exposure_estimated")) else ""
    which = exposed_value_words(row)
    which += ":" if which else ""
    said = f"; exposure{which} {float(exposure):.1f} bits over the values of its format{how}"
    exposed = row.get("secret_exposed")
    if pd.notna(exposed):
        said += (", exposed: ranked higher than never-trained values of its format at the run's false-"
                 "discovery rate, and not by the reference model as well" if _true(exposed)
                 else ", not exposed: within what never-trained values or the reference model reach")
        said += exposure_bounds(row)
    return said


def exposed_value_words(row: pd.Series) -> str:
    """" of the card number 4400 2978 7534 7783" when the text's most exposed value (the one its
    exposure is about) is not the value its other columns show; "" when it is."""
    value, kind = row.get("secret_exposure_value"), row.get("secret_exposure_kind")
    if not isinstance(value, str) or value == row.get("secret_value"):
        return ""
    words = secret_kind(kind).the
    return f" of {words} {value}"


def exposure_bounds(row: pd.Series) -> str:
    """" (never-trained 99th percentile 6.6 bits, reference model 1.9)": the two numbers an exposure
    must pass to be exposed, beside it ("" when neither was stored)."""
    p99, ref = row.get("secret_exposure_null_p99"), row.get("secret_reference_exposure")
    parts = ([f"never-trained 99th percentile {float(p99):.1f} bits"] if pd.notna(p99) else []) + (
        [f"reference model {float(ref):.1f}"] if pd.notna(ref) else [])
    return f" ({', '.join(parts)})" if parts else ""


def _secret_attack(row: pd.Series) -> str:
    """The secret-targeted attack's outcome in words ('' when the text's secret was not attacked):
    the status's word first, then the most exposed value's characters, then how many values."""
    if pd.isna(row.get("secret_reproduced")) or pd.isna(row.get("secret_chars")):
        return ""
    n, hits = int(row["secret_chars"]), int(row["secret_chars_reproduced"])
    what = secret_words(row)
    ref_hits = row.get("reference_secret_chars_reproduced")
    exposure = row.get("secret_exposure")
    exp = _exposure_clause(row, exposure)
    attacked = int(row["secret_values_attacked"]) if pd.notna(row.get("secret_values_attacked")) else 1
    leaked_n = int(row["secret_values_leaked"]) if pd.notna(row.get("secret_values_leaked")) else int(
        _true(row["secret_reproduced"]))
    partly_n = int(row["secret_values_partly"]) if pd.notna(row.get("secret_values_partly")) else 0
    values = ""
    if attacked > 1:
        values = (f"; {leaked_n} of its {attacked} values come out whole"
                  + (f", {partly_n} in part" if partly_n else ""))
    ref = " (the reference model writes fewer)" if pd.notna(ref_hits) else ""
    if leaked_n:
        ref = " (the reference model does not)" if pd.notna(ref_hits) else ""
        return (f"leaked: prompted with the text up to it, the model writes {what} "
                f"({hits} of {n} characters){ref}{values}{exp}")
    window = _true(row.get("extracted"))
    came_out = ""
    if window:
        came_out = f" (its next {int(row['attack_suffix_tokens'])} tokens after the first " \
                   f"{int(row['attack_prefix_tokens'])} do come out word for word)" \
            if pd.notna(row.get("attack_suffix_tokens")) else " (the text attack's window does come out)"
    part = written_part(row)
    if partly_n:
        return (f"partly leaked: prompted with the text up to it, the model writes {part}{ref}{came_out}"
                f"{values}{exp}")
    head = "text reproduced, the value not: " if window else "not leaked: "
    if hits == n:
        said = f"{head}the model writes {what}, but so does the reference model: predictable"
    else:
        said = f"{head}prompted with the text up to it, the model writes {part}"
    return said + came_out + values + exp


def value_written(row: pd.Series) -> ValueMatch | None:
    """What the model wrote in place of the text's most exposed value (sources.value_match), when
    the stored generation gives the stored count (None otherwise, e.g. a store whose count lined
    characters up by position: then only the count is said)."""
    value, generated = row.get("secret_value"), row.get("secret_value_generated")
    if not (isinstance(value, str) and isinstance(generated, str)) or pd.isna(row.get("secret_chars")):
        return None
    match = compare(value, generated)
    same = match.hits == int(row["secret_chars_reproduced"]) and match.chars == int(row["secret_chars"])
    return match if same else None


def written_part(row: pd.Series, its: bool = False) -> str:
    """The part of the value the model wrote, in words: "3 of 4 characters of the PIN", or for a
    complete other value "7399, not the PIN 7319: a different value, 3 of its 4 characters in
    place" (``its``: "3 of its 4 characters", for a sentence about the value)."""
    n, hits = int(row["secret_chars"]), int(row["secret_chars_reproduced"])
    what, match = secret_words(row), value_written(row)
    free = _free_part(row)
    if match is not None and match.different:
        said = (f"{match.written_text}, not {what} {row['secret_value']}: a different value, {hits} of its "
                f"{n} characters in place")
        return said + (f" ({free[0]} of its {free[1]} free characters; {_null(free)})" if free else "")
    if free:
        where = f"its {free[1]}" if its else f"{free[1]}"
        return f"{free[0]} of {where} free characters" + ("" if its else f" of {what}") + f"; {_null(free)}"
    return f"{hits} of its {n} characters" if its else f"{hits} of {n} characters of {what}"


def _free_part(row: pd.Series) -> tuple[int, int, float] | None:
    """(free characters written in place, free characters, a never-trained value's mean) of the text's
    most exposed value, where its free part was stored (attacks/partial_leak.py)."""
    n, hits, null = (row.get(c) for c in ("secret_free_chars", "secret_free_chars_reproduced",
                                         "secret_free_null_mean"))
    if any(v is None or pd.isna(v) for v in (n, hits, null)):
        return None
    return int(hits), int(n), float(null)


def _null(free: tuple[int, int, float]) -> str:
    return f"never-trained values of its template get {free[2]:.1f} on average"


def _evidence(row: pd.Series, parts: pd.Series, unique: bool, status: str = "") -> tuple[str, bool]:
    """The GNQ and loss-ratio evidence in words, and whether it is strong on its own: the loss
    ratio to the reference, or GNQ in the direction this run's ground truth validated (on the
    runs measured, learned texts had smaller GNQ: a high GNQ is no sign of memorisation by itself)."""
    g, sign = parts["gnq_percentile_valid"], int(parts.get("gnq_sign", 0))
    ratio = row.get("loss_ratio")
    bits = []
    if pd.notna(g):
        bits.append(f"GNQ {_share(g)}" + (" (lower GNQ = more at risk on this run)" if sign < 0 else ""))
    if pd.notna(ratio) and ratio > 0:
        if ratio <= 1 / 1.5:
            bits.append(f"loss {1 / ratio:.0f}× below the reference" if ratio <= 0.4
                        else f"loss {1 / ratio:.1f}× below the reference")
        else:
            bits.append("loss no lower than the reference's")
    text = " and ".join(bits)
    gnq_strong = pd.notna(g) and sign != 0 and (g if sign > 0 else 1 - g) >= 0.8
    ratio_strong = pd.notna(ratio) and ratio <= 1 / 1.5
    strong = gnq_strong or ratio_strong
    if status in (LOW, PUBLIC):  # the words must not claim more than the status
        if strong:
            return f"{text}, but memorisation risk overall below this run's top 20%", False
        return (f"no strong sign of memorisation: {text}" if text else ""), False
    if unique and strong:
        return f"unique, strong evidence: {text}", True
    if not text or strong or status:
        return text, strong
    return f"no strong sign of memorisation: {text}", False
