"""A run's report to hand on: one self-contained HTML file (``gnq report``, the dashboard's download).

Sections: the verdict in plain words (how many texts leaked, which hold secrets, what to do),
the verdict table (text first, copies collapsed into one row "×N", a one-line reason and the
recommended action; the run's ranking: the combined verdict's ``rank`` when the frame carries
one, else GNQ_total), the evidence tables per outcome (analysis.evidence: AUC over all texts and
within exact length, TPR at low FPR, CV gain over length + loss) with the ROC chart, the top
flagged texts in full, what GNQ is on this run (analysis.gnq_nature), and last what produced the
run (provenance, its settings as rows).  Every table fits a 1200 px page and prints (long texts
wrap).  The numbers come from analysis.run_report, as ``gnq report --json``'s do.  Plotly's
JavaScript is inlined, so the file opens offline and loads nothing from the network.  Every text
from the data (texts, group names, run names, settings) is HTML-escaped: a hostile training text
cannot inject markup.
"""

from __future__ import annotations

import html
import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from gnq_core.analysis import clusters as cl
from gnq_core.analysis import evidence as ev
from gnq_core.analysis import predictive as pr
from gnq_core.analysis import run_report
from gnq_core.analysis.exposures import VALUES_HELP, fdr_sentence, null_sentence, values_table
from gnq_core.analysis.findings import summary, texts_table_html
from gnq_core.analysis.gnq_nature import companion_sentence
from gnq_core.analysis.predictive_figures import roc_figure
from gnq_core.analysis.verdict import rank_texts
from gnq_core.common.atomic import check_target, write_text_atomic
from gnq_core.results.store import Store
from gnq_core.results.store_queries import Run

TOP = 50           # rows of the verdict table
TEXTS_IN_FULL = 10  # top flagged texts shown with their whole text and the model's continuation
TABLE_TEXT = 160   # characters of a text in the verdict table

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1200px;
     padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em}h2{margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0;max-width:100%}
th,td{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top;overflow-wrap:anywhere}
th{background:#f4f4f4}.caption{color:#555;font-size:.85em;max-width:1000px}
.text{white-space:pre-wrap;background:#fafafa;border-left:3px solid #b2182b;padding:.4em .7em;
      font-family:ui-monospace,monospace;font-size:.85em}
.sentence{font-size:1.05em;background:#eef4fb;padding:.6em .9em;border-radius:4px}
@media print{body{margin:0;max-width:none}h2{break-after:avoid}details{display:block}}
"""


def ordered(frame: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The texts in the run's flagged order and a phrase naming it: the combined verdict's
    ``rank`` when present (analysis.verdict), else GNQ_total (highest first)."""
    if "verdict_score" in frame.columns and "rank" in frame.columns:
        return frame.sort_values(["rank", "example_id"]), "the combined verdict (rank 1 = look first)"
    return (frame.sort_values(["gnq_total", "example_id"], ascending=[False, True], na_position="last"),
            "GNQ_total, highest first (no combined verdict in this run's frame)")


def build_report(store: Store, run: Run, *, totals: pd.DataFrame | None = None, top: int = TOP,
                 resamples: int = pr.RESAMPLES, seed: int = 0, command: str = "",
                 data: run_report.RunReport | None = None) -> str:
    """The whole report as one HTML string (``data``: run_report.build's, when already made)."""
    if data is None:  # the run's texts in the verdict's order, its risk tested with the rest
        data = run_report.build(store, run, totals=totals if totals is not None
                                else rank_texts(store.example_totals(run.run_id)),
                                resamples=resamples, seed=seed)
    frame = data.frame
    if "member" in frame.columns:  # non-member texts are scored, not listed
        frame = frame[frame["member"].astype("boolean").fillna(True).astype(bool)]
    ranked, order_name = ordered(frame)
    attacks = store.extractions(run.run_id)
    # one of each copy cluster (its best-ranked copy) among the texts in full
    key = ranked["example_id"]
    if "cluster_id" in ranked:
        key = ranked["cluster_id"].fillna(key)
    distinct = ranked[~key.duplicated()]
    e = html.escape
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
             f"<title>GNQ Audit report: {e(run.name)}</title><style>{_STYLE}</style></head><body>",
             f"<h1>GNQ Audit report: run <code>{e(run.name)}</code></h1>",
             f"<p class='caption'>Generated {datetime.now():%Y-%m-%d %H:%M} from the store "
             f"<code>{e(str(store.path))}</code>"
             + (f" by <code>{e(command)}</code>" if command else "") + ". One file, no network needed.</p>",
             f"<p class='sentence'>{e(summary(ranked))}</p>",
             "<h2>Verdict: the texts to look at first</h2>",
             f"<p class='caption'>Ordered by {e(order_name)}; copies of a text share one row (×N). "
             f"The first {min(top, len(ranked))} of {len(ranked)} texts.</p>",
             f"<p class='{'sentence' if data.risk.loss_only else 'caption'}'><b>Memorisation risk: "
             f"{e(data.risk.shown)}.</b> {e(data.risk.sentence)}</p>",
             texts_table_html(ranked.head(top)) if "status" in ranked else _verdict_table(ranked.head(top)),
             "<h2>Which signal predicts extraction?</h2>", _predictive(data, attacks),
             _other_outcomes(data, plotly_loaded=_scorable(frame, attacks)),
             *_exposure(data.exposure),
             f"<h2>Top {min(TEXTS_IN_FULL, len(distinct))} flagged texts in full</h2>",
             _texts_in_full(distinct.head(TEXTS_IN_FULL)),
             "<h2>What GNQ is on this run</h2>", _nature(data),
             f"<p class='caption'>{e(data.gnq_source)} GNQ = g_jᵀ(Σ_{{k≠j}} g_k g_kᵀ + λI)⁻¹ g_j: "
             "how much of a text's gradient its batch companions cannot explain; about 1 or less: explained "
             "(a copy in the same batch gives ≈ 1), large: its batch does not explain its gradient — on "
             "the runs measured, not a mark of memorisation beyond length, loss, copies and K_jj "
             "(docs/evidence.md). "
             "Compare values within a run.</p>",
             "<h2>Provenance</h2>", _provenance(data.provenance),
             "</body></html>"]
    return "\n".join(parts)


def write_report(text: str, out: str | Path) -> Path:
    """Write atomically (a temporary sibling, then a rename): never a half-written report."""
    return write_text_atomic(out, text)


def check_writable(out: str | Path) -> Path:
    """Refuse, before any work, an output path that is a folder, not a regular file (a FIFO, a
    device) or cannot be written."""
    out = Path(out)
    check_target(out, "the report")  # a folder, a FIFO or a device is refused, never replaced
    if not out.parent.is_dir():
        raise ValueError(f"{out}: the folder {out.parent} does not exist")
    probe = out.with_name(f".{out.name}.probe-{os.getpid()}")
    try:
        probe.write_text("", encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{out}: cannot write the report here ({exc.strerror or exc})") from None
    probe.unlink(missing_ok=True)
    return out


# ----------------------------------------------------------------------------------------- sections
def _table(frame: pd.DataFrame) -> str:
    """pandas' HTML table; cells escaped (its default), floats to 4 significant digits."""
    return frame.to_html(index=False, escape=True, border=0, na_rep="",
                         float_format=lambda v: f"{v:.4g}")


def _provenance(fields: list[tuple[str, Any]]) -> str:
    rows: list[tuple[str, Any]] = []
    for key, value in fields:  # the settings as rows (an attack's rule in words), not one JSON blob
        settings = json.loads(value) if key == "settings" and isinstance(value, str) else None
        if not isinstance(settings, dict):
            rows.append((key, value))
            continue
        for name, item in sorted(settings.items()):
            if isinstance(item, dict):
                rows += [(f"{name}: {k}", v if not isinstance(v, dict | list) else json.dumps(v, default=str))
                         for k, v in sorted(item.items())]
            else:
                rows.append((name, ", ".join(map(str, item)) if isinstance(item, list) else item))
    frame = pd.DataFrame([(k, "" if v is None or (isinstance(v, float) and pd.isna(v)) else str(v))
                          for k, v in rows], columns=["field", "value"])
    return _table(frame)


def _nature(data: run_report.RunReport) -> str:
    """The sentence on GNQ vs the gradient norm, and the record-level GNQ of copy clusters."""
    e = html.escape
    companions = companion_sentence(data.run.settings)
    parts = [*([f"<p class='sentence'>{e(companions)}</p>"] if companions else []),
             f"<p class='sentence'>{e(data.nature['sentence'])}</p>",
             "<p class='caption'>K_jj = ‖g_j‖² is the gradient norm squared; without batch companions "
             "GNQ = K_jj/λ, and the share 1 − GNQ·λ/K_jj is what the companions explain (λ_eff for a "
             "relative λ). Thresholds: docs/DESIGN.md §8.</p>"]
    if len(data.records):
        shown = data.records.head(20)
        incomplete = int((~data.records["complete"]).sum())
        parts += [f"<h3>Record-level GNQ of the {len(data.records)} copy clusters</h3>",
                  "<p class='caption'>Per cluster of copies: the sum of GNQ over the batches where exactly "
                  "one copy appears (the record's exposure, docs/DESIGN.md §8). "
                  + (f"{incomplete} clusters had copies sharing a batch: those batches would need the "
                     "leave-cluster-out solve, which needs the gradients (not stored), so their record GNQ "
                     "is a lower bound (complete = False)." if incomplete else
                     "No copies shared a batch, so every value is complete.") + "</p>", _table(shown)]
    return "\n".join(parts)


VERDICT_COLUMNS = ["rank", "status", "reason", "risk", "example_id", "group", "gnq_total", "gnq_percentile",
                   "percentile", "loss_last", "copies", "secret", "extracted", "extraction_match",
                   "reference_match", "text"]


def _verdict_table(top: pd.DataFrame) -> str:
    if top.empty:
        return "<p>No texts in this run.</p>"
    shown = top.assign(text=top["text"].map(lambda t: _short(t, TABLE_TEXT)))
    if "verdict_score" not in shown.columns:
        shown = shown.drop(columns=[c for c in ("rank", "percentile") if c in shown.columns])
        shown.insert(0, "position", range(1, len(shown) + 1))
    columns = [c for c in ["position", *VERDICT_COLUMNS] if c in shown.columns
               and (c == "text" or shown[c].notna().any())]
    return _table(shown[columns])


def _predictive(data: run_report.RunReport, attacks: pd.DataFrame) -> str:
    e = html.escape
    frame = data.frame
    if not _scorable(frame, attacks):
        return ("<p>No extraction attack is stored for this run, so no signal can be scored against it. "
                "Run <code>gnq extract --run NAME</code> and make the report again.</p>")
    result = pr.evaluate(frame, resamples=data.resamples, seed=data.seed)
    figure = roc_figure(pr.roc_points(frame), result).to_html(full_html=False, include_plotlyjs=True,
                                                              config={"displaylogo": False})
    table = ev.display(data.evidence, "extraction")
    records = ev.display(data.evidence, "extraction", unit=cl.UNIT_RECORDS)
    by_record = pr.evaluate(frame, resamples=data.resamples, seed=data.seed, unit=cl.UNIT_RECORDS)
    return "\n".join([f"<p class='sentence'>{e(pr.best_signal_sentence(result))}</p>",
                      f"<p>{e(pr.within_length_sentence(result))} {e(ev.gain_sentence(data.evidence))}</p>",
                      "<h3>Unit: texts (copies of one record resampled together)</h3>",
                      _table(table) if len(table) else "",
                      "<h3>Unit: records (copies collapsed to one record)</h3>",
                      f"<p>{e(ev.gain_sentence(data.evidence, unit=cl.UNIT_RECORDS))}</p>",
                      _table(records) if len(records) else "",
                      f"<p class='caption'>{e(ev.method(data.resamples, data.seed, data.level))}</p>",
                      figure, "<h3>Precision among the top-ranked texts</h3>",
                      _table(pr.display_table(result)),
                      f"<p class='caption'>{e(result.method())}</p>",
                      "<h3>Precision among the top-ranked records (copies collapsed)</h3>",
                      _table(pr.display_table(by_record)),
                      f"<p class='caption'>{e(by_record.method())}</p>"])


def _scorable(frame: pd.DataFrame, attacks: pd.DataFrame) -> bool:
    """An attack is stored and some text has its outcome (the predictive section, with plotly.js)."""
    return not attacks.empty and "extracted" in frame.columns and bool(frame["extracted"].notna().any())


def _other_outcomes(data: run_report.RunReport, plotly_loaded: bool) -> str:
    """Membership (when the run has non-members) and group outcomes: the same table per outcome."""
    e = html.escape
    parts = []
    for (outcome, positive), _ in data.evidence[(data.evidence["outcome"] != "extraction")
                                                & (data.evidence["unit"] == cl.UNIT_TEXTS)].groupby(
            ["outcome", "positive"], sort=False):
        title = ("Which signal tells members from non-members?" if outcome == "membership"
                 else f"Which signal tells {positive} from the other texts?")
        rows = data.evidence[data.evidence["positive"] == positive]
        parts += [f"<h2>{e(title)}</h2>", "<h3>Unit: texts</h3>",
                  _table(ev.display(data.evidence, outcome, positive)),
                  f"<p>{e(ev.gain_sentence(rows, outcome))}</p>",
                  "<h3>Unit: records (copies collapsed to one)</h3>",
                  _table(ev.display(data.evidence, outcome, positive, unit=cl.UNIT_RECORDS)),
                  f"<p>{e(ev.gain_sentence(rows, outcome, unit=cl.UNIT_RECORDS))}</p>"]
        if outcome == "membership":  # the field's view: TPR at low FPR on a log axis
            points = pr.roc_points(data.frame, outcome="member")
            shown = rows[(rows["scope"] == ev.SCOPE_ALL) & (rows["unit"] == cl.UNIT_TEXTS)]
            figure = roc_figure(points, shown, log_fpr=True, positive="member", negative="non-member")
            parts.append(figure.to_html(full_html=False, include_plotlyjs=not plotly_loaded,
                                        config={"displaylogo": False}))
    return "\n".join(parts)


def _exposure(summary: dict) -> list[str]:
    """The secret values' exposure and each format's null (none: no section)."""
    if not summary.get("values"):
        return []
    e = html.escape
    share = summary["exact_share"]
    return ["<h2>Secret values: exposure</h2>",
            "<p class='caption'>One row per distinct value (copies share it). Exposure = log2 of the "
            "value's space (its free digits, the format's other characters kept) − log2 of its rank there "
            "by the audited model's likelihood; the reference model's beside it. "
            f"{summary['exact']} of {summary['exact'] + summary['estimated']} ranks exact"
            + (f" ({share:.0%}); the others estimated by sampling from the model (their fit in the JSON)"
               if share is not None and summary["estimated"] else "")
            + f". {e(fdr_sentence(summary))}</p>",
            _table(values_table(summary, fit=False)),
            "<p class='caption'>" + " ".join(f"<b>{e(name)}</b>: {e(VALUES_HELP[name])}"
                                             for name in _EXPLAINED) + "</p>",
            "<h3>Never-trained values of each format (the control)</h3>",
            *[f"<p class='caption'>{e(null_sentence(f))}</p>" for f in summary["formats"]]]


# the exposure table's columns a reader must interpret, explained under it
_EXPLAINED = ("exposure (bits)", "reference (bits)", "p-value", "reference LR p", "exposed",
              "never-trained 99th pct (bits)")


def _texts_in_full(top: pd.DataFrame) -> str:
    e = html.escape
    blocks = []
    for position, (_, row) in enumerate(top.iterrows(), start=1):
        head = [f"#{position}", f"example {int(row['example_id'])}"]
        if "reason" in row and pd.notna(row.get("reason")):
            head.append(str(row["reason"]))
        if pd.notna(row.get("gnq_total")):
            head.append(f"GNQ_total {row['gnq_total']:.4g}")
        if pd.notna(row.get("extraction_match")):
            extracted = pd.notna(row.get("extracted")) and bool(row.get("extracted"))
            head.append(f"attack match {row['extraction_match']:.2f}" + (" — extracted" if extracted else ""))
        block = [f"<h3>{e(' · '.join(head))}</h3>", f"<div class='text'>{e(str(row['text']))}</div>"]
        if pd.notna(row.get("extraction_generated")):
            block.append("<p class='caption'>The model's continuation after the revealed prefix:</p>"
                         f"<div class='text'>{e(str(row['extraction_generated']))}</div>")
        blocks.append("\n".join(block))
    return "\n".join(blocks) or "<p>No texts in this run.</p>"


def _short(text: Any, limit: int) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
