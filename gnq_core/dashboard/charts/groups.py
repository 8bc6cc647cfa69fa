"""GNQ per group at each point (the Groups page)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from gnq_core.dashboard.charts import base


def group_distributions(traj: pd.DataFrame, groups: list[str] | None = None, *,
                        texts: Mapping[int, str] | None = None, colors: Mapping[str, str] | None = None,
                        log_y: bool | None = None, max_rows: int = 20000) -> go.Figure:
    """Box plots of GNQ at each point, one box per group side by side (paper Fig. 3).

    Up to ``max_rows`` rows the boxes are drawn from the samples (outliers shown, with the
    example id and text on hover, customdata = [example id]); above it the quartiles and
    1.5·IQR whiskers are computed here and only the boxes are sent to the browser.
    """
    title = "GNQ by group at each point"
    if traj.empty or not {"example_id", "point", "gnq"} <= set(traj.columns):
        return base.empty_figure(title)
    frame = traj.assign(group=base.groups_of(traj), gnq=pd.to_numeric(traj["gnq"], errors="coerce"))
    frame = frame[np.isfinite(frame["gnq"].astype(float))]
    wanted = sorted(frame["group"].unique()) if groups is None else [base.group_name(g) for g in groups]
    frame = frame[frame["group"].isin(wanted)]
    if frame.empty:
        return base.empty_figure(title)
    if log_y is None:
        log_y = base.use_log(frame["gnq"])
    labels = base.point_labels(frame)
    colors = dict(colors) if colors is not None else base.group_colors(base.groups_of(traj))
    text_of = base.texts_for(traj, texts)
    fig = go.Figure()
    raw = len(frame) <= max_rows
    for g in wanted:
        part = frame[frame["group"] == g]
        if part.empty:
            continue
        common = {"name": base.escape(g), "marker": {"color": colors.get(g, base.OTHER_COLOR), "size": 4},
                  "line": {"width": 1.5}, "legendgroup": base.escape(g)}
        if raw:
            ids = part["example_id"].astype(int).to_numpy()
            fig.add_trace(go.Box(
                x=part["point"].astype(int), y=part["gnq"], boxpoints="outliers", customdata=ids[:, None],
                text=[f"#{i} {base.short_text(text_of.get(i))}" for i in ids], hoverinfo="y+text+name",
                hoveron="boxes+points", **common))
        else:
            stats = _box_stats(part)
            fig.add_trace(go.Box(x=stats.index.tolist(), q1=stats["q1"], median=stats["median"],
                                 q3=stats["q3"], lowerfence=stats["lo"], upperfence=stats["hi"],
                                 boxpoints=False, hoverinfo="y+name", **common))
    fig.update_layout(boxmode="group")
    fig = base.layout(fig, title, "point", "GNQ", log_y=bool(log_y))
    base.point_axis(fig, labels.index.tolist(), labels.tolist())
    if not raw:
        fig.add_annotation(text=f"box statistics from {len(frame):,} rows; individual outliers not drawn",
                           xref="paper", yref="paper", x=1, y=1.06, showarrow=False, xanchor="right",
                           font={"size": 11, "color": base.NEUTRAL})
    return fig


def _box_stats(part: pd.DataFrame) -> pd.DataFrame:
    """Per point: quartiles and whiskers at the furthest samples within 1.5·IQR (as plotly draws)."""
    rows = {}
    for p, one in part.groupby(part["point"].astype(int), sort=True):
        v = one["gnq"].astype(float).to_numpy()
        q1, med, q3 = np.percentile(v, [25, 50, 75])
        iqr = q3 - q1
        inside = v[(v >= q1 - 1.5 * iqr) & (v <= q3 + 1.5 * iqr)]
        rows[p] = {"q1": q1, "median": med, "q3": q3, "lo": inside.min(), "hi": inside.max()}
    return pd.DataFrame.from_dict(rows, orient="index")
