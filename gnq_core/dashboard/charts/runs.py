"""Figures of the Runs page: the GNQ histogram and GNQ against loss."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from gnq_core.dashboard.charts import base


def gnq_histogram(totals: pd.DataFrame, column: str = "gnq_total", log_x: bool | None = None,
                  bins: int = 50) -> go.Figure:
    """Distribution of ``column`` over examples; on log10 values when they span decades.

    Bars carry customdata [example id of the bin's highest value, its text, count, lo, hi]
    (lo/hi in the column's own units), so a click can list the bin's examples.
    """
    name = base.label(column)
    title = f"Distribution of {name}"
    if totals.empty or column not in totals.columns:
        return base.empty_figure(title)
    values = pd.to_numeric(totals[column], errors="coerce").astype(float)
    keep = np.isfinite(values)
    if log_x is None:
        log_x = base.use_log(values[keep])
    if log_x:
        keep &= values > 0
    if not keep.any():
        return base.empty_figure(title, "no positive values to show on a log scale" if log_x else "no data")
    frame = totals.loc[keep]
    raw = values[keep].to_numpy()
    shown = np.log10(raw) if log_x else raw
    ids = frame["example_id"].astype(int).to_numpy() if "example_id" in frame.columns else np.arange(len(raw))
    text_of = base.texts_for(frame, None)
    edges = np.histogram_bin_edges(shown, bins=max(1, min(int(bins), len(np.unique(shown)) * 2)))
    which = np.clip(np.searchsorted(edges, shown, side="right") - 1, 0, len(edges) - 2)
    counts = np.bincount(which, minlength=len(edges) - 1)
    custom = []
    for i in range(len(edges) - 1):
        members = np.flatnonzero(which == i)
        lo, hi = (10 ** edges[i], 10 ** edges[i + 1]) if log_x else (edges[i], edges[i + 1])
        if members.size:
            best = int(ids[members[np.argmax(raw[members])]])
            custom.append([best, base.short_text(text_of.get(best)), int(counts[i]), lo, hi])
        else:
            custom.append([None, "", 0, lo, hi])
    fig = go.Figure(go.Bar(
        x=(edges[:-1] + edges[1:]) / 2, y=counts, width=np.diff(edges), customdata=custom,
        marker={"color": base.GROUP_PALETTE[0], "line": {"width": 0}}, name=name,
        hovertemplate=(f"{base.escape(name)} %{{customdata[3]:.4g}} – %{{customdata[4]:.4g}}<br>"
                       "%{y} examples<br>highest: #%{customdata[0]} %{customdata[1]}<extra></extra>")))
    fig.update_layout(bargap=0.02)
    return base.layout(fig, title, f"{name} (log10)" if log_x else name, "examples")


def gnq_vs_loss(totals: pd.DataFrame, max_points: int = 5000, seed: int = 0, *,
                colors: Mapping[str, str] | None = None, keep_top: int = 50) -> go.Figure:
    """GNQ_total against the last point's loss, one colour per group (the MIA comparison).

    Drawn on at most ``max_points`` examples: the ``keep_top`` highest GNQ_total always, the
    rest a seeded random sample.  customdata: [example id, text, group, rank, extraction match].
    """
    title = "GNQ_total vs. loss"
    need = {"example_id", "gnq_total", "loss_last"}
    if totals.empty or not need <= set(totals.columns):
        return base.empty_figure(title)
    gnq = pd.to_numeric(totals["gnq_total"], errors="coerce").astype(float)
    loss = pd.to_numeric(totals["loss_last"], errors="coerce").astype(float)
    frame = totals.loc[np.isfinite(gnq) & np.isfinite(loss)]
    if frame.empty:
        return base.empty_figure(title)
    n_all = len(frame)
    if n_all > max_points:
        order = frame.assign(_g=-gnq[frame.index]).sort_values(["_g", "example_id"], kind="mergesort")
        top = order.index[: min(keep_top, max_points)]
        rest = order.index[min(keep_top, max_points):]
        rng = np.random.default_rng(seed)
        pick = rng.choice(len(rest), size=max(0, max_points - len(top)), replace=False)
        frame = frame.loc[top.append(rest[np.sort(pick)])]
    log_x, log_y = base.use_log(gnq[frame.index]), base.use_log(loss[frame.index])
    groups = base.groups_of(frame)
    colors = dict(colors) if colors is not None else base.group_colors(groups)
    cls = base.scatter_cls(len(frame))
    fig = go.Figure()
    for g in sorted(groups.unique()):
        part = frame.loc[groups == g]
        custom = [[int(r.example_id), base.short_text(r.text if "text" in part.columns else None),
                   base.escape(g), base.fmt(getattr(r, "rank", None), ".0f"),
                   base.fmt(getattr(r, "extraction_match", None), ".2f")]
                  for r in part.itertuples(index=False)]
        fig.add_trace(cls(
            x=gnq[part.index], y=loss[part.index], mode="markers", name=base.escape(g), customdata=custom,
            marker={"color": colors.get(g, base.OTHER_COLOR), "size": 6, "opacity": 0.75},
            hovertemplate=("#%{customdata[0]} (%{customdata[2]}) rank %{customdata[3]}<br>"
                           "%{customdata[1]}<br>"
                           "GNQ_total %{x:.4g} · loss %{y:.4g} · extraction match %{customdata[4]}"
                           "<extra></extra>")))
    fig = base.layout(fig, title, base.label("gnq_total"), base.label("loss_last"), log_x=log_x, log_y=log_y)
    if len(frame) < n_all:
        kept = min(keep_top, max_points)
        fig.add_annotation(text=f"showing {len(frame):,} of {n_all:,} examples (top {kept} "
                                "by GNQ_total always shown)", xref="paper", yref="paper", x=1, y=1.06,
                           showarrow=False, xanchor="right", font={"size": 11, "color": base.NEUTRAL})
    return fig
