"""The studies' report: Markdown with tables and static PNG figures (matplotlib, Agg backend).

Numbers are formatted by one function (``fmt``) so a test can recompute a value from the store
and find it in the report.  Every report ends with the command that reproduces it, the compute
time and the machine; ``results.json`` beside it holds the same numbers for scripts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gnq_core.analysis import clusters as cl
from gnq_core.analysis import evidence as ev
from gnq_core.analysis import predictive as pr
from gnq_core.common.runtime import resolve_device
from research.studies.base import StudyContext, Timings, machine

Format = str | Callable[[Any], str]
GROUP_COLOURS = {"common": "tab:orange", "surprising": "tab:blue"}  # as in the paper's Fig. 3–4


def fmt(value: Any, spec: str = ".3f") -> str:
    """A number as the report prints it; 'n/a' for missing or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return "n/a"
    if isinstance(value, bool | np.bool_):
        return "yes" if value else "no"
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        return format(float(value), spec)
    return str(value)


def markdown_table(frame: pd.DataFrame, formats: Mapping[str, Format] | None = None) -> str:
    """A GitHub-flavoured Markdown table; floats as ``fmt`` (per-column format specs or callables)."""
    formats = dict(formats or {})

    def cell(column: str, value: Any) -> str:
        f = formats.get(column, ".3f")
        text = f(value) if callable(f) else fmt(value, f)
        return text.replace("|", "\\|").replace("\n", " ")

    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(cell(c, v) for c, v in zip(frame.columns, row, strict=True)) + " |"
            for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body])


class Report:
    """Collects Markdown blocks and figures; ``write`` puts report.md and results.json in ``folder``."""

    def __init__(self, folder: Path, title: str) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.blocks: list[str] = [f"# {title}"]

    def text(self, markdown: str) -> None:
        self.blocks.append(markdown.strip())

    def table(self, frame: pd.DataFrame, formats: Mapping[str, Format] | None = None,
              caption: str | None = None) -> None:
        self.blocks.append(markdown_table(frame, formats) + (f"\n\n*{caption}*" if caption else ""))

    def figure(self, fig, filename: str, caption: str) -> None:
        import matplotlib.pyplot as plt

        fig.savefig(self.folder / filename, dpi=110, bbox_inches="tight")
        plt.close(fig)
        self.blocks.append(f"![{caption}]({filename})\n\n*{caption}*")

    def write(self, results: dict[str, Any], *, command: str, timings: Timings, device: str = "auto") -> Path:
        self.text(f"""## Reproduce

```
{command}
```

Compute time: {timings.total / 60:.1f} min summed over the invocations that built these results
(stages: {', '.join(f'{k} {v:.0f} s' for k, v in timings.data.items())}); this invocation
{timings.this_invocation():.0f} s. Machine: {machine(device)}. Every stage resumes: rerunning the
command skips what is finished and rewrites this report from the store.""")
        results = results | {"compute_seconds": timings.total, "stages": dict(timings.data),
                             "machine": machine(device)}
        path = self.folder / "report.md"
        path.write_text("\n\n".join(self.blocks) + "\n", encoding="utf-8")
        (self.folder / "results.json").write_text(json.dumps(results, indent=2, default=_jsonable) + "\n",
                                                  encoding="utf-8")
        return path


def with_bin_intervals(bins: pd.DataFrame, attacked: pd.DataFrame, threshold: float,
                       seed: int) -> pd.DataFrame:
    """``summaries.quantile_bins`` rows with each bin's success rate interval (rate lo, rate hi:
    95% Wilson, ``predictive.rate_interval``)."""
    match = attacked.set_index("example_id")["extraction_match"]
    lo, hi = [], []
    for ids in bins["example_ids"]:
        _, a, b = pr.rate_interval((match.loc[ids] >= threshold).to_numpy(), seed=seed)
        lo.append(a), hi.append(b)
    return bins.assign(**{"rate lo": lo, "rate hi": hi})


def ci(point: Any, lo: Any, hi: Any, spec: str = ".2f") -> str:
    """"estimate [lo, hi]" as the reports print an interval ('n/a' parts for missing values)."""
    return f"{fmt(point, spec)} [{fmt(lo, spec)}, {fmt(hi, spec)}]"


def ci_column(frame: pd.DataFrame, point: str, lo: str | None = None, hi: str | None = None,
              spec: str = ".2f") -> list[str]:
    """``ci`` of each row of ``frame``: columns ``point``, ``lo``, ``hi`` (default "POINT lo", "POINT hi")."""
    return [ci(a, b, c, spec) for a, b, c in zip(frame[point], frame[lo or f"{point} lo"],
                                                 frame[hi or f"{point} hi"], strict=True)]


def auc_interval(scores: np.ndarray, labels: np.ndarray, seed: int, groups: np.ndarray | None = None,
                 min_records: int = cl.MIN_RECORDS) -> tuple[float, float]:
    """The 95% interval of the AUC over ``predictive.RESAMPLES`` cluster-bootstrap resamples (copy
    clusters ``groups`` drawn whole, each outcome on its own; None: every text its own record),
    expanded for the effective number of records (analysis.clusters).  (NaN, NaN) with fewer than
    ``min_records`` independent positive or negative records: no interval is honest there."""
    y = np.asarray(labels, dtype=bool)
    if cl.too_few(y, groups, min_records):
        return math.nan, math.nan
    boot = pr.bootstrap(scores, y, pr.RESAMPLES, seed, groups, fpr_levels=(), fractions=())["auc"]
    return pr.interval(boot, pr.LEVEL, cl.effective_records(y, groups))


def auc_cell(auc: float, values: Any, labels: Any, seed: int, groups: Any = None,
             min_records: int = cl.MIN_RECORDS) -> str:
    """"AUC [95% interval]" over the texts with a finite value (``auc_interval``, copies in
    ``groups`` resampled together); the AUC alone when they hold one class; "AUC (too few: k
    positive records)" under ``min_records`` independent records of either outcome."""
    v, y = np.asarray(values, dtype=float), np.asarray(labels, dtype=bool)
    keep = np.isfinite(v)
    if not 0 < y[keep].sum() < keep.sum():
        return fmt(auc)
    g = None if groups is None else np.asarray(groups)[keep]
    if cl.too_few(y[keep], g, min_records):
        pos, neg = cl.records(y[keep], g)
        return f"{fmt(auc)} ({cl.TOO_FEW}: {pos} vs {neg} records)"
    return ci(auc, *auc_interval(v[keep], y[keep], seed, g, min_records), ".3f")


def ratio_sentence(ratio: pd.Series) -> str:
    """What GNQ·λ/K_jj (each in-run score's) says: near 1, GNQ ranks like the gradient norm."""
    lo, hi = ratio.quantile(0.1), ratio.quantile(0.9)
    return f"""Median GNQ·λ/K_jj over the in-run scores: {ratio.median():.3f} (10–90%: {lo:.3f}–
{hi:.3f}); 1 would mean batch companions explain nothing of a text's gradient, so
GNQ ranks like ‖g‖²/λ."""


def scale_banner(ctx: StudyContext, model: str) -> str:
    """The report's first line: at which scale and on which device its numbers were measured."""
    device = resolve_device(ctx.device)
    where = "CPU" if device.type == "cpu" else f"{device.type.upper()} ({machine(ctx.device).split(' (')[0]})"
    if ctx.preset == "paper":
        return f"> **Scale: the paper's** ({model}), measured on {where}."
    return (f"> **Scale: {where} small-scale ({ctx.preset} mode), not the paper's scale** ({model}). The "
            "paper-scale run (GPT-2 small 12×768) is the same command with `--scale paper`, on a CUDA GPU.")


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return None if np.isnan(value) else float(value)
    if isinstance(value, pd.DataFrame):
        return json.loads(value.to_json(orient="records"))
    return str(value)


# ----------------------------------------------------------------------------------------- figures
def _axes(width: float = 7, height: float = 4):
    """A new figure and its axes (matplotlib's Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height))


def group_bands(traj: pd.DataFrame, value: str, groups: Sequence[str], *, title: str, ylabel: str,
                xlabels: Sequence[str], log: bool = True):
    """Per group: the median of ``value`` over the points (line) and its 25–75% range (band)."""
    fig, ax = _axes()
    points = sorted(traj["point"].unique())
    for g in groups:
        part = traj[traj["group"] == g]
        q = part.groupby("point")[value].quantile([0.25, 0.5, 0.75]).unstack().reindex(points)
        colour = GROUP_COLOURS.get(g)
        ax.plot(points, q[0.5], marker="o", label=f"{g} (median)", color=colour)
        ax.fill_between(points, q[0.25], q[0.75], alpha=0.25, color=colour)
    if log:
        ax.set_yscale("log")
    ax.set_xticks(points, list(xlabels), rotation=45 if len(points) > 8 else 0)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def group_histograms(values: pd.Series, groups: pd.Series, order: Sequence[str], *, title: str, xlabel: str):
    fig, ax = _axes()
    v = values.astype(float)
    finite = v[np.isfinite(v)]
    edges = np.histogram_bin_edges(finite, bins=30) if len(finite) else 10
    for g in order:
        ax.hist(v[(groups == g) & np.isfinite(v)], bins=edges, alpha=0.55, label=g,
                color=GROUP_COLOURS.get(g))
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("texts")
    ax.legend()
    return fig


def auc_lines(series: Mapping[str, pd.DataFrame], constants: Mapping[str, float], *, title: str):
    """AUC per point for each metric (frames from ``summaries.group_separation``), constants as lines."""
    fig, ax = _axes()
    for name, frame in series.items():
        ax.plot(frame["label"], frame["auc"], marker="o", label=name)
    for (name, value), style in zip(constants.items(), ["--", ":", "-."], strict=False):
        if not math.isnan(value):
            ax.axhline(value, linestyle=style, color="grey", label=f"{name} ({value:.3f})")
    ax.axhline(0.5, color="black", linewidth=0.5)
    ax.set_ylim(0, 1)
    ax.set_ylabel("AUC (surprising > common)")
    ax.set_title(title)
    ax.tick_params(axis="x", rotation=45)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def strategy_bars(table: pd.DataFrame, *, title: str):
    """Extraction rate per target set and budget (rows of ``analysis.targeted_rows``)."""
    fig, ax = _axes(8, 4)
    targets = list(dict.fromkeys(table["target"]))
    fractions = sorted(table["fraction"].unique())
    width = 0.8 / max(1, len(fractions))
    for i, f in enumerate(fractions):
        part = table[table["fraction"] == f].set_index("target").reindex(targets)
        ax.bar(np.arange(len(targets)) + i * width, part["rate"], width, label=f"top {f:.0%}")
    ax.set_xticks(np.arange(len(targets)) + width * (len(fractions) - 1) / 2, targets, rotation=30,
                  ha="right")
    ax.set_ylabel("extracted / k")
    ax.set_ylim(0, 1.05)
    ax.set_title(title)
    ax.legend()
    return fig


def trajectory_lines(matrix: pd.DataFrame, labels: Sequence[str], *, title: str, highlight: Sequence[int]):
    """One GNQ line per example (rows of an example × point matrix), log scale."""
    fig, ax = _axes(8, 4.5)
    x = np.arange(matrix.shape[1])
    for example_id, row in matrix.iterrows():
        strong = example_id in highlight
        ax.plot(x, row.to_numpy(dtype=float), marker="o" if strong else None, linewidth=2 if strong else 0.8,
                alpha=1.0 if strong else 0.6, label=f"#{example_id}" if strong else None)
    ax.set_yscale("log")
    ax.set_xticks(x, list(labels), rotation=45 if len(labels) > 8 else 0)
    ax.set_ylabel("GNQ")
    ax.set_title(title)
    if highlight:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def quantile_bars(bins: pd.DataFrame, *, title: str, score_label: str):
    """Attack success per quantile bin (bars) with the bin's mean score (line, right axis)."""
    fig, ax = _axes()
    ax.bar(bins["bin"], bins["success_rate"], color="tab:blue", alpha=0.7, label="attack success rate")
    ax.set_xlabel(f"{score_label} quantile bin (1 = lowest)")
    ax.set_ylabel("success rate")
    ax.set_ylim(0, 1.05)
    ax.set_xticks(bins["bin"])
    right = ax.twinx()
    right.plot(bins["bin"], bins["mean_score"], color="tab:red", marker="o", label=f"mean {score_label}")
    right.set_yscale("log")
    right.set_ylabel(f"mean {score_label}")
    ax.set_title(title)
    fig.legend(loc="upper left", bbox_to_anchor=(0.12, 0.88), fontsize=8)
    return fig


def display_stratified(result: pr.Predictive, digits: int = 2) -> pd.DataFrame:
    """``Predictive.stratified`` as "value [lo, hi]" strings, best raw AUC first."""
    table = result.stratified.sort_values("auc", ascending=False, na_position="last")
    fmt = f".{digits}f"
    return pd.DataFrame({
        "signal": table["label"],
        "AUC (all texts)": [pr.interval_cell(r, "auc", fmt) for _, r in table.iterrows()],
        "AUC within exact length (pair-weighted)": [
            pr.interval_cell(r, "stratified auc", fmt, "stratified lo", "stratified hi")
            for _, r in table.iterrows()],
        "lengths scored": [pr.fmt_int(v) for v in table["strata"]],
        "pairs": [pr.fmt_int(v) for v in table["pairs"]],
        "positive records": [pr.fmt_int(v) for v in table["records"]],
    }).reset_index(drop=True)


def roc_png(points: pd.DataFrame, table: pd.DataFrame, *, log_fpr: bool = True, positive: str = "extracted",
            negative: str = "kept"):
    """The ROC curves of analysis.predictive_figures.roc_figure as a matplotlib figure (for the
    Markdown reports), log FPR axis by default: ``table`` holds one row per signal with label and AUC
    with its interval."""
    fig, ax = _axes(6.5, 5)
    scored = table[table["auc"].notna()].sort_values("auc", ascending=False)
    for i, (_, row) in enumerate(scored.iterrows()):
        curve = points[points["signal"] == row["signal"]]
        ax.step(curve["fpr"], curve["tpr"], where="post", linewidth=2.2 if i == 0 else 1.1,
                label=f"{row['label']} ({row['auc']:.2f} [{row['auc lo']:.2f}, {row['auc hi']:.2f}])")
    lo = 1e-3 if log_fpr else 0.0
    ax.plot([lo, 1], [lo, 1], ":", color="grey")
    if log_fpr:
        ax.set_xscale("log")
        ax.set_xlim(1e-3, 1)
    ax.set_xlabel(f"false-positive rate ({negative} texts flagged)" + (", log scale" if log_fpr else ""))
    ax.set_ylabel(f"true-positive rate ({positive} texts flagged)")
    ax.set_title(f"Which signal tells the {positive} texts apart?")
    if len(scored):
        ax.legend(fontsize=7, loc="upper left" if log_fpr else "lower right")
    else:
        ax.text(0.5, 0.5, f"no signal can be scored:\nit needs {positive} and {negative} texts", ha="center",
                transform=ax.transAxes)
    ax.grid(alpha=0.3)
    return fig


def predictive_section(r: Report, frame: pd.DataFrame, *, filename: str, what: str, seed: int = 0
                       ) -> dict[str, Any]:
    """Add the predictive-power table of every signal in ``frame`` (analysis.signals'
    frame of the attacked run) against its ``extracted`` outcome, its ROC chart and the length-bin
    table; returns the numbers for results.json."""
    result = pr.evaluate(frame, seed=seed)
    sentence, length_sentence = pr.best_signal_sentence(result), pr.within_length_sentence(result)
    r.text("### Which signal predicts extraction?")
    r.text(f"{sentence}\n\n{length_sentence}")
    r.table(pr.display_table(result), caption=f"{what} Each cell: estimate [{result.level:.0%} interval]. "
                                              + result.method())

    r.figure(roc_png(pr.roc_points(frame), result.table[result.table["scope"] == pr.ALL]), filename,
             "ROC curve of each signal against the attack's outcome, log false-positive axis (legend: AUC "
             "[95% interval]); dotted: chance.")
    r.table(display_stratified(result),
            caption="Controlled for text length: each signal's AUC over all attacked texts next to its AUC "
                    "within exact token length, pair-weighted (only an extracted and a kept text of the same "
                    "length are compared; a length whose texts share one outcome adds nothing; bootstrap "
                    "over all texts). A signal that is a function of length alone scores 0.5 "
                    "there, whatever length predicts overall.")
    extraction = [o for o in ev.outcomes_in(frame) if o.name == "extraction"]
    evidence = ev.evidence_table(frame, seed=seed, outcomes=extraction)
    if len(evidence):
        r.text(ev.gain_sentence(evidence))
        r.table(ev.display(evidence, "extraction"),
                caption="Every signal over all texts, at low FPR, within exact token length and as the "
                        "cross-validated gain over length + loss (analysis.evidence, the table `gnq report "
                        "--json` writes). " + ev.method(pr.RESAMPLES, seed, result.level))
    return {"predictive": result.table, "predictive_sentence": sentence, "predictive_bins": length_sentence,
            "predictive_stratified": result.stratified, "evidence": evidence}
