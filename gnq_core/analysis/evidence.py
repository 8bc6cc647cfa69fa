"""Every table of a run, computed once: per outcome × signal × scope, the numbers the HTML report,
the dashboard's Extraction page and ``gnq report --json`` show.  Pure functions of a frame.

The frame contract (docs/DESIGN.md, "The evidence frame"): one row per text, ``example_id``,
``n_tokens``, ``loss_last`` (the loss at the attacked point), any signal columns
``predictive.SIGNALS`` names, and outcome columns, each a nullable boolean (NA: no outcome for
that text, left out of that outcome's rows):

* ``extracted`` — the calibrated attack extracted the text (outcome ``extraction``);
* ``member`` — True for a training text, False for a text the model never saw (outcome
  ``membership``: scored only when the frame holds both);
* ``group`` — a text's group; each group of a run with 2..MAX_GROUPS groups is scored one
  against the rest (outcome ``group``, positive ``group = NAME``).

Scopes: ``all`` (AUC and TPR at each low FPR over every text with both values), ``exact length``
(pair-weighted AUC within exact token length, predictive.within_length_auc) and
``over length + loss`` (cross-validated AUC gain, length_control.cv_gain).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gnq_core.analysis import clusters as cl
from gnq_core.analysis import length_control as lc
from gnq_core.analysis import predictive as pr

FPR_LEVELS = (0.001, 0.01, 0.10)   # the membership literature's low-FPR view (LiRA, MIMIR)
MAX_GROUPS = 6
SCOPE_ALL, SCOPE_LENGTH, SCOPE_GAIN = "all", "exact length", "over length + loss"
SCOPES = (SCOPE_ALL, SCOPE_LENGTH, SCOPE_GAIN)
LOSS = "loss_last"

_TPR = [f"tpr@{a:g}" for a in FPR_LEVELS]
COLUMNS = ["outcome", "positive", "unit", "signal", "label", "direction", "scope", "n", "positives",
           "records", "negative records",
           "auc", "auc lo", "auc hi", *(c for t in _TPR for c in (t, f"{t} lo", f"{t} hi")),
           "strata", "pairs", "gain", "gain lo", "gain hi", "auc base", "auc full", "lr p", "base", "note"]


@dataclass(frozen=True)
class Outcome:
    name: str          # extraction, membership, group
    positive: str      # what a positive is, in words ("extracted", "member", "group = facts")
    labels: pd.Series  # nullable boolean per row of the frame


# How copies of one record combine in the "records" unit.  An event happens to the record when it
# happens to any copy: the record leaked if any copy was extracted, and its content is in the
# training data if any copy was trained on (a near copy of a training text is no clean non-member:
# the model saw its content, which is why membership benchmarks drop such non-members).  Any other
# outcome (a group) is a label each text has of its own: near copies can disagree (a true fact and
# its made-up claim differ only in the object), and such a record has no label, not the positive one.
EVENTS = ("extraction", "membership")


def any_copy(outcome: Outcome) -> bool:
    """Whether a record is positive when any of its copies is (an event), rather than only when its
    copies agree (a per-text label; EVENTS says why)."""
    return outcome.name in EVENTS


def outcomes_in(frame: pd.DataFrame) -> list[Outcome]:
    """The outcomes the frame can score (each needs both values among its rows)."""
    found: list[Outcome] = []
    for name, column, positive in (("extraction", "extracted", "extracted"),
                                   ("membership", "member", "member")):
        if column in frame.columns:
            y = frame[column].astype("boolean")
            if y.notna().any() and 0 < y.dropna().sum() < y.notna().sum():
                found.append(Outcome(name, positive, y))
    if "group" in frame.columns:
        groups = frame["group"].dropna().astype(str)
        names = sorted(groups.unique())
        if 2 <= len(names) <= MAX_GROUPS:
            for g in names[:1] if len(names) == 2 else names:  # two groups: one is the other's mirror
                y = (frame["group"].astype(str) == g).astype("boolean").where(frame["group"].notna())
                found.append(Outcome("group", f"group = {g}", y))
    return found


def with_non_members(members: pd.DataFrame, non_members: pd.DataFrame) -> pd.DataFrame:
    """One evidence frame from a run's texts (``member`` True) and texts the model never saw
    (``member`` False, no extraction outcome): the membership outcome's input.  Non-member ids
    are offset past the members' so ``example_id`` stays unique, and so are their copy clusters
    (``cluster_id`` is an example id of their own set): a non-member never joins a member's record,
    which any copy would make a member."""
    offset = int(members["example_id"].max()) + 1 if len(members) else 0
    extra = non_members.assign(member=False, example_id=non_members["example_id"] + offset)
    if cl.CLUSTER in extra.columns:
        extra[cl.CLUSTER] = extra[cl.CLUSTER] + offset
    if "extracted" in extra.columns:
        extra = extra.assign(extracted=pd.NA)
    frame = pd.concat([members.assign(member=True), extra], ignore_index=True)
    if "extracted" in frame.columns:
        frame["extracted"] = frame["extracted"].astype("boolean")
    return frame


def with_membership(frame: pd.DataFrame, membership: pd.DataFrame) -> pd.DataFrame:
    """The run's rows (membership NA) plus a membership frame's rows (``member`` True/False, every
    other outcome NA; ids offset past the run's): the membership outcome reads only the latter,
    whose members and non-members were measured at the same checkpoint in the same way."""
    offset = int(frame["example_id"].max()) + 1 if len(frame) else 0
    extra = membership.assign(example_id=membership["example_id"] + offset, extracted=pd.NA, group=None)
    out = pd.concat([frame.assign(member=pd.NA), extra], ignore_index=True)
    out["member"] = out["member"].astype("boolean")
    if "extracted" in out.columns:
        out["extracted"] = out["extracted"].astype("boolean")
    return out


def _rows(frame: pd.DataFrame, outcome: Outcome, signal: pr.Signal, *, resamples: int, seed: int,
          level: float, cv: bool, cache: dict, unit: str, min_records: int) -> Iterator[dict]:
    known = outcome.labels.notna().to_numpy()
    y = outcome.labels.fillna(False).to_numpy(dtype=bool)[known]
    score = pr.oriented(frame[signal.column], signal)[known]
    groups = cl.groups_of(frame)[known]
    lengths = (pd.to_numeric(frame["n_tokens"], errors="coerce").to_numpy(float)[known]
               if "n_tokens" in frame.columns else np.zeros(int(known.sum())))
    loss = (pd.to_numeric(frame[LOSS], errors="coerce").to_numpy(float)[known]
            if LOSS in frame.columns else None)
    copies = (pd.to_numeric(frame["copies"], errors="coerce").to_numpy(float)[known]
              if "copies" in frame.columns and frame["copies"].notna().any() else cl.copy_counts(groups))
    keep = np.isfinite(score)
    pos, neg = cl.records(y[keep], groups[keep])
    head = {"outcome": outcome.name, "positive": outcome.positive, "unit": unit, "signal": signal.column,
            "label": signal.label, "direction": "higher" if signal.higher_means_extracted else "lower",
            "n": int(keep.sum()), "positives": int(y[keep].sum()), "records": pos, "negative records": neg}
    scorable = 0 < y[keep].sum() < keep.sum()
    few = cl.too_few(y[keep], groups[keep], min_records) if scorable else ""
    if few:  # no number in any scope
        for scope in SCOPES:
            yield {**head, "scope": scope, "note": few}
        return
    row = {**head, "scope": SCOPE_ALL}
    if scorable:
        row |= pr.metrics_with_intervals(score[keep], y[keep], groups[keep], resamples, seed, level,
                                         fpr_levels=FPR_LEVELS, fractions=())[0]
    else:
        row["note"] = "needs both outcomes among the texts with this signal"
    yield row
    row = {**head, "scope": SCOPE_LENGTH}
    if scorable:
        w = pr.within_length_auc(score, y, lengths, resamples=resamples, seed=seed, level=level,
                                 groups=groups, min_records=min_records)
        row |= {"auc": w.auc, "auc lo": w.lo, "auc hi": w.hi, "strata": w.strata, "pairs": w.pairs}
        if not w.strata:
            row["note"] = "no token length holds both outcomes"
        elif w.note:
            row["note"] = w.note
    yield row
    row = {**head, "scope": SCOPE_GAIN}
    if scorable and cv:
        g = lc.cv_gain(score, y, lengths, loss, resamples=resamples, seed=seed, level=level,
                       signal_is_loss=signal.column == LOSS, cache=cache, groups=groups,
                       min_records=min_records, copies=None if signal.column == "copies" else copies)
        row |= {"gain": g.gain, "gain lo": g.lo, "gain hi": g.hi, "auc base": g.auc_base,
                "auc full": g.auc_full, "lr p": g.lr_p, "base": g.base, "note": g.note or np.nan}
    elif scorable:
        row["note"] = "not computed (cv=False)"
    yield row


def evidence_table(frame: pd.DataFrame, *, resamples: int = pr.RESAMPLES, seed: int = 0,
                   level: float = pr.LEVEL, signals: Sequence[pr.Signal] | None = None,
                   outcomes: Sequence[Outcome] | None = None, cv: bool = True,
                   units: Sequence[str] = cl.UNITS, min_records: int = cl.MIN_RECORDS) -> pd.DataFrame:
    """One row per outcome × unit × signal × scope (``COLUMNS``; NaN where a number does not
    apply).  Unit "texts": every text, copies (``cluster_id``) resampled and folded together;
    "records": copies collapsed to one record (``clusters.collapse``), an event outcome
    (``EVENTS``) positive when any copy's is, any other outcome left out for a record whose copies
    disagree (the note counts them).  ``cv=False`` skips the cross-validated gain (scikit-learn;
    the slowest part).  Fewer than ``min_records`` independent positive or negative records: the
    row's numbers are NaN and its note says "too few"."""
    rows = []
    on_texts = list(outcomes) if outcomes is not None else outcomes_in(frame)
    for unit in units:
        f, found = frame, [(o, 0) for o in on_texts]  # (outcome, records left out: copies disagree)
        if unit == cl.UNIT_RECORDS:  # each outcome collapsed with the copies (EVENTS: any, else agree)
            cols = {f"_outcome{i}": o.labels.astype("boolean") for i, o in enumerate(on_texts)}
            events = tuple(c for c, o in zip(cols, on_texts, strict=True) if any_copy(o))
            f = cl.collapse(frame.assign(**cols), outcomes=("extracted", "member", *events),
                            properties=tuple(c for c in cols if c not in events))
            groups = cl.groups_of(frame)
            found = [(Outcome(o.name, o.positive, f[c]),
                      0 if c in events else cl.mixed_records(o.labels, groups))
                     for o, c in zip(on_texts, cols, strict=True)]
            found = [(o, k) for o, k in found if 0 < o.labels.dropna().sum() < o.labels.notna().sum()]
        for outcome, left_out in found:
            scored, cache = f[outcome.labels.notna()], {}
            for signal in signals if signals is not None else pr.signals_in(scored):
                for row in _rows(f, outcome, signal, resamples=resamples, seed=seed, level=level, cv=cv,
                                 cache=cache, unit=unit, min_records=min_records):
                    rows.append(_with_left_out(row, left_out))
    return pd.DataFrame(rows, columns=COLUMNS)


def _with_left_out(row: dict, mixed: int) -> dict:
    """The row, its note saying how many records were left out for copies that disagree."""
    if not mixed:
        return row
    said = f"{mixed} record{'s' if mixed != 1 else ''} left out: copies disagree on this label"
    note = row.get("note")
    return row | {"note": f"{note}; {said}" if isinstance(note, str) and note else said}


def display(table: pd.DataFrame, outcome: str, positive: str | None = None, digits: int = 2,
            unit: str = cl.UNIT_TEXTS) -> pd.DataFrame:
    """One row per signal of one outcome in one ``unit`` (texts or records): "value [lo, hi]" cells
    for the AUC over all texts, TPR at each low FPR, the AUC within exact length and the CV gain
    over length + loss, "too few" where the independent records are too few; best AUC first."""
    part = table[(table["outcome"] == outcome) & (table["unit"] == unit)]
    if positive is not None:
        part = part[part["positive"] == positive]
    if part.empty:
        return pd.DataFrame()
    by = {scope: part[part["scope"] == scope].set_index("signal") for scope in SCOPES}
    order = by[SCOPE_ALL].sort_values("auc", ascending=False, na_position="last").index
    fmt = f".{digits}f"
    first = by[SCOPE_ALL].loc[order]  # the "all texts" rows, best AUC first
    out = pd.DataFrame({"signal": first["label"].to_numpy(),
                        "direction": [f"{d} = {part['positive'].iloc[0].removeprefix('group = ')}"
                                      for d in first["direction"]],
                        unit: first["n"].to_numpy(), "positives": first["positives"].to_numpy(),
                        "independent positives (records)": first["records"].to_numpy()})
    for key, title in [("auc", "AUC (all texts)"), *((t, pr.metric_title(t)) for t in _TPR)]:
        out[title] = [pr.interval_cell(row, key, fmt) for _, row in first.iterrows()]
    out["AUC within exact length"] = [pr.interval_cell(by[SCOPE_LENGTH].loc[s], "auc", fmt) for s in order]
    gains = by[SCOPE_GAIN]
    out["CV AUC gain over length + loss"] = [
        pr.interval_cell(gains.loc[s], "gain", f"+.{digits + 1}f") if s in gains.index else "n/a"
        for s in order]
    out["LR p"] = ["n/a" if s not in gains.index or pd.isna(gains.loc[s, "lr p"])
                   else f"{gains.loc[s, 'lr p']:.2g}" for s in order]
    return out


# ----------------------------------------------------------------------------------------- words
def gain_sentence(table: pd.DataFrame, outcome: str = "extraction", unit: str = cl.UNIT_TEXTS) -> str:
    """Which signals add information over length + loss (CV gain interval above 0), in words."""
    rows = table[(table["outcome"] == outcome) & (table["scope"] == SCOPE_GAIN) & (table["unit"] == unit)]
    part = rows[rows["gain"].notna()]
    if part.empty:
        pos = int(rows["records"].max()) if len(rows) and rows["records"].notna().any() else 0
        return ("No signal's gain over length + loss could be cross-validated: too few independent records "
                f"of one outcome ({pos} positive records, copies counted once).")
    loss = part[part["signal"] == LOSS]
    part = part[part["signal"] != LOSS]  # loss's own gain is over length alone: said apart
    adds = part[part["gain lo"] > 0].sort_values("gain", ascending=False)
    lead = ("Over a logistic model of text length (spline), loss and log copies, "
            + (", ".join(f"{r['label']} adds {r['gain']:+.3f} CV AUC "
                         f"({r['gain lo']:+.3f} to {r['gain hi']:+.3f})" for _, r in adds.iterrows())
               if len(adds)
               else "no signal adds AUC whose interval lies above 0"))
    gnq = part[part["signal"] == "gnq_total"]
    tail = ""
    if len(gnq) and "gnq_total" not in set(adds["signal"]):
        r = gnq.iloc[0]
        tail = f"; GNQ_total: {r['gain']:+.3f} ({r['gain lo']:+.3f} to {r['gain hi']:+.3f})"
    if len(loss):
        r = loss.iloc[0]
        tail += (f". Loss itself adds {r['gain']:+.3f} ({r['gain lo']:+.3f} to {r['gain hi']:+.3f}) over "
                 "length alone")
    return lead + tail + "."


def method(resamples: int, seed: int, level: float) -> str:
    """How the evidence table was made, in one paragraph."""
    return (f"Each table states its unit: texts (copies of one record kept, and resampled and folded "
            f"together) or records (copies collapsed to one: numbers averaged; extracted or member when any "
            f"copy is; a group label, a property of each text, left out where copies disagree); "
            f"'independent positives' counts records. "
            f"AUC: P(a positive text scores higher than a negative one, ties ½) in the signal's stated "
            f"direction. TPR at x% FPR: largest share of positives caught while flagging at most x% of "
            f"the negatives (ties not split; n/a with fewer than 1/x negative records, which cannot resolve "
            f"that rate). AUC within exact length: only a positive and a negative text "
            f"of the same token length are compared, each length weighted by its pairs (a length whose "
            f"texts share one outcome adds nothing). CV gain: {lc.FOLDS}-fold out-of-fold AUC (folds "
            f"stratified by outcome and grouped by copy cluster) of a logistic regression on [length spline, "
            f"loss, log copies, signal] minus [length spline, loss, log copies] (the copy count is in the "
            f"base: the tool has it, and copies lower GNQ); LR p: likelihood-ratio test of adding the signal "
            f"(χ², 1 df), fitted on records. " + pr.interval_method(resamples, seed, level))
