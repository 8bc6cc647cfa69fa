"""What to do about a run's results, in one screen: the verdict's texts with copies collapsed
into one row, a recommended action per text, a plain summary, and the text-first table every
page and the report show.

Actions follow from the verdict (analysis/verdict.py), not from a model of their own:

* leaked with a secret-like value: scrub the value from the data and retrain (or unlearn), and
  treat the secret as exposed (change it): the model writes it;
* partly leaked: the same, the value partly exposed;
* text reproduced (the window came out, the secret did not): scrub the value before the next
  training, remove the text if it is private;
* public: nothing to do;
* leaked, repeated: deduplicate (keep at most one copy, or none) and retrain;
* leaked, unique: remove it if it is private and retrain; a public text needs nothing;
* secret-like, not leaked: scrub the value before the next training; no retraining for it now,
  unless its exposure (the model ranks it above most random values of its format) is high;
* at risk and repeated: deduplicate before the next training;
* anything else: nothing to do.
"""

from __future__ import annotations

import html

import pandas as pd

from gnq_core.analysis.counts import RunCounts, by_record, run_counts
from gnq_core.analysis.verdict import (
    LEAKED,
    PARTLY,
    PUBLIC,
    REPRODUCED,
    SECRET,
    exposed_value_words,
    exposure_bounds,
    row_kind,
    secret_words,
    written_part,
)
from gnq_core.catalog import count_words

GROUP_COLUMNS = ["example_id", "text", "status", "copies_listed", "copies", "example_ids", "reason_short",
                 "reason", "action", "rank", "turns", "extracted", "extraction_target"]


def action(row: pd.Series) -> str:
    """The recommended next step for one verdict row."""
    status = row.get("status")
    copies = int(row["copies"]) if pd.notna(row.get("copies")) else 1
    has_secret = isinstance(row.get("secret"), str)  # the kinds found, "card number, pin"
    what = secret_words(row) if has_secret else ""
    remedy = row_kind(row).remedy  # what to do with the value in the world (the catalog's action)
    value = row.get("secret_value") if isinstance(row.get("secret_value"), str) else row.get("secret_match")
    span = f" ({value})" if isinstance(value, str) else ""
    exposure = row.get("secret_exposure")
    dedupe = f" Deduplicate its {copies} copies too." if copies > 1 else ""
    other = exposed_value_words(row)  # a value of the text other than the one its status is about
    also = ""
    if status in (PARTLY, REPRODUCED, LEAKED) and _yes(row.get("secret_exposed")) and other:
        also = (f" Scrub{other.removeprefix(' of')} too: the model ranks it above never-trained values of "
                f"its format and the reference (exposure {float(exposure):.1f} bits"
                f"{', estimated' if _yes(row.get('secret_exposure_estimated')) else ''}).")
    dedupe = also + dedupe
    if status == PUBLIC:
        return "Nothing to do: marked public."
    if status == PARTLY:
        n, hits = row.get("secret_chars"), row.get("secret_chars_reproduced")
        part = written_part(row, its=True) if pd.notna(n) and pd.notna(hits) else "part of it"
        return (f"Scrub {what}{span} from the data and retrain (or unlearn it): the model writes {part}. "
                f"Treat it as partly exposed: {remedy}.{dedupe}")
    if status == REPRODUCED:
        return (f"Scrub {what}{span} before the next training: the model writes the text around it, not the "
                f"value itself. Remove the text if it is private.{dedupe}")
    if status == LEAKED:
        if has_secret:
            return (f"Scrub {what}{span} from the data and retrain (or unlearn it): the model writes it. "
                    f"Treat it as exposed: {remedy}.{also}")
        if copies > 1:
            return f"Deduplicate: keep at most one of its {copies} copies, then retrain: the model writes it."
        return ("Remove it if it is private, then retrain: the model writes it. If it is public, mark it so "
                "(--public-column) and nothing is needed.")
    if status == SECRET:
        if pd.notna(exposure) and _yes(row.get("secret_exposed")):
            how = ", estimated" if _yes(row.get("secret_exposure_estimated")) else ""
            if other:  # the exposed value is not the one named first
                what, span = other.removeprefix(" of "), ""
            return (f"Scrub {what}{span} and retrain soon: the model does not write it yet, but ranks it "
                    f"above most values of its format (exposure {float(exposure):.1f} bits{how}), beyond "
                    f"never-trained values and the reference model{exposure_bounds(row)}.{dedupe}")
        if not _attacked(row):  # no attack stored: whether the model writes it is not known yet
            return (f"Scrub {what}{span} before the next training. No attack is stored for this run yet: "
                    f"run gnq extract to learn whether the model writes it.{dedupe}")
        return (f"Scrub {what}{span} before the next training; no retraining needed for it now: the model "
                f"does not write it.{dedupe}")
    if status == "at risk" and copies > 1:
        return f"Deduplicate its {copies} copies before the next training; no retraining needed now."
    return "Nothing to do."


def _yes(value: object) -> bool:
    return bool(pd.notna(value) and bool(value))


def _attacked(row: pd.Series) -> bool:
    """Whether an attack was stored for this text (its secret values probed, or its window)."""
    return any(pd.notna(row.get(c)) for c in ("secret_values_attacked", "extraction_match", "extracted"))


def grouped(ranked: pd.DataFrame) -> pd.DataFrame:
    """One row per text, copies collapsed into the best-ranked one (``copies_listed`` of them,
    ``example_ids`` all), in verdict order, with a one-line reason and the action."""
    if ranked.empty:
        return pd.DataFrame(columns=GROUP_COLUMNS)
    rows = []
    for _, members in by_record(ranked):
        first = members.iloc[0]
        reason = str(first.get("reason") or "")
        copies = first.get("copies")  # in the whole data: a list of the top texts may hold fewer
        rows.append({"example_id": int(first["example_id"]), "text": first["text"],
                     "status": first.get("status"), "copies_listed": len(members),
                     "copies": max(len(members), int(copies) if pd.notna(copies) else 1),
                     "example_ids": [int(i) for i in members["example_id"]],
                     "reason_short": reason.split("; ")[0], "reason": reason, "action": action(first),
                     "rank": first.get("rank"), "turns": first.get("turns"),
                     "extracted": first.get("extracted"),
                     "extraction_target": first.get("extraction_target")})
    return pd.DataFrame(rows, columns=GROUP_COLUMNS)


def _plural(n: int, word: str) -> str:
    if n == 1:
        return f"{n} {word}"
    return f"{n} " + (word.replace(" or ", "s or ") + "s" if not word.endswith("ss") else word + "es")


def summary(ranked: pd.DataFrame, counts: RunCounts | None = None) -> str:
    """The run's verdict in a sentence or three, e.g. "3 texts leaked (2 PINs, 1 text without a
    secret-like value) ...", every number from ``counts`` (analysis.counts, the one object
    every page's counts come from); texts are the verdict's rows, copies included."""
    if ranked.empty or "status" not in ranked:
        return "No texts in this run."
    c = counts or run_counts(ranked)
    leaked, partly, reproduced = c.status(LEAKED), c.status(PARTLY), c.status(REPRODUCED)
    secret, public = c.status(SECRET), c.status(PUBLIC)
    if not c.attacked:
        head = "No extraction attack stored yet: nothing is known to have leaked."
    elif not leaked:  # a partial leak is not "nothing": said at once, with its own action below
        head = "No text leaked whole." if partly else "No text leaked."
    else:
        head = f"{_plural(leaked, 'text')} leaked"
        if c.distinct_by_status.get(LEAKED, leaked) != leaked:
            head += f" ({c.distinct_by_status[LEAKED]} distinct, with their copies)"
        with_value = sum(c.leaked_kinds.values())
        parts = [count_words(k, n) for k, n in c.leaked_kinds.items()]
        if leaked - with_value:
            parts.append(_plural(leaked - with_value, "text") + " without a secret-like value, word for word")
        if with_value:
            head += ": " + ", ".join(parts)
        head += "."
    more = []
    if partly:
        more.append(f"{_plural(partly, 'text')} partly leaked: the model writes part of a secret-like value "
                    "(or a different value sharing characters with it).")
    if reproduced:
        verb = "comes" if reproduced == 1 else "come"
        more.append(f"{_plural(reproduced, 'text')} with a secret-like value {verb} out word for word around "
                    "it, the value not: text reproduced, not a leaked secret.")
    if secret:
        verb = "holds a secret-like value" if secret == 1 else "hold secret-like values"
        exposed = (f" ({c.secret_texts_exposed} of them ranked above never-trained values of their format "
                   "and the reference model: exposed)" if c.secret_texts_exposed else "")
        more.append(f"{_plural(secret, 'other text')} {verb} the model does not write{exposed}.")
    if public:
        more.append(f"{_plural(public, 'text')} marked public.")
    do = []
    if leaked:
        do.append("scrub or remove the leaked texts and retrain (change any leaked secret)")
    if partly:
        do.append("scrub the partly leaked values and retrain or unlearn them (change them: part of each "
                  "is out)")
    if c.secret_texts_exposed:
        do.append("scrub the exposed values and retrain soon")
    if secret - c.secret_texts_exposed or reproduced:
        do.append("scrub the other secrets before the next training")
    if (grouped(ranked)["copies_listed"] > 1).any():
        do.append("deduplicate repeated texts")
    return " ".join([head, *more]) + (" To do: " + "; ".join(do) + "." if do else "")


_TAG = {LEAKED: "#b2182b", PARTLY: "#d6604d", REPRODUCED: "#f4a582", SECRET: "#8c510a", "at risk": "#4393c3",
        "low": "#878787", PUBLIC: "#1b7837"}
TABLE_STYLE = """
.gnq-texts{border-collapse:collapse;width:100%;table-layout:fixed;font-size:.9em}
.gnq-texts th,.gnq-texts td{border-bottom:1px solid #ddd;padding:.35em .5em;text-align:left;
  vertical-align:top;overflow-wrap:anywhere;word-break:break-word}
.gnq-texts th{background:#f4f4f4}.gnq-texts .t{width:46%}.gnq-texts .s{width:7em}
.gnq-texts .tag{color:#fff;border-radius:3px;padding:0 .35em;font-size:.85em;white-space:nowrap}
.gnq-texts details{font-size:.85em;color:#555}.gnq-texts .why{color:#333}
@media print{.gnq-texts{font-size:.75em}.gnq-texts tr{break-inside:avoid}}
"""


def _text_cell(row: pd.Series) -> str:
    """A text as it reads: a conversation's turns with what came out marked in its turn (the raw
    template tokens behind "as tokenised"); a plain text escaped."""
    from gnq_core.analysis.conversation import conversation_html, leaked_span

    text, layout = str(row["text"]), row.get("turns")
    if not isinstance(layout, str):
        return html.escape(text)
    span = leaked_span(text, row.get("extraction_target")) if _yes(row.get("extracted")) else None
    return conversation_html(text, layout, [span] if span else [])


def texts_table_html(ranked: pd.DataFrame, *, limit: int | None = None) -> str:
    """The text-first table: text (wrapped), a status tag with ×N for copies, the one-line reason
    (the whole reason and the copies' ids expand below) and the action.  Fits any width: no
    column is wider than the page; every value is HTML-escaped."""
    e = html.escape
    rows = grouped(ranked)
    if limit is not None:
        rows = rows.head(limit)
    if rows.empty:
        return "<p>No texts.</p>"
    body = []
    for _, r in rows.iterrows():
        n, listed = int(r["copies"]), int(r["copies_listed"])  # ×N: the data's copies, as the action says
        colour = _TAG.get(r["status"], "#878787")
        tag = (f"<span class='tag' style='background:{colour}'>{e(str(r['status']))}</span>"
               + (f" ×{n}" if n > 1 else ""))
        more = [f"<div>{e(r['reason'])}</div>"] if r["reason"] != r["reason_short"] else []
        ids = ", ".join(str(i) for i in r["example_ids"])
        more.append(f"<div>example {ids}</div>" if n == 1 else
                    f"<div>{n} copies: examples {ids}</div>" if listed == n else
                    f"<div>{n} copies, {listed} in this list: example{'s' if listed > 1 else ''} {ids}</div>")
        body.append(f"<tr><td class='t'>{_text_cell(r)}</td><td class='s'>{tag}</td>"
                    f"<td><span class='why'>{e(r['reason_short'])}</span>"
                    f"<details><summary>more</summary>{''.join(more)}</details></td>"
                    f"<td>{e(r['action'])}</td></tr>")
    return (f"<style>{TABLE_STYLE}</style><table class='gnq-texts'><thead><tr><th class='t'>text</th>"
            "<th class='s'>status</th><th>why</th><th>what to do</th></tr></thead><tbody>"
            + "".join(body) + "</tbody></table>")
