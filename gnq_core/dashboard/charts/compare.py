"""The Compare runs page's figure: one run's GNQ_total against another's, text by text."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from gnq_core.dashboard.charts import base


def run_comparison(pairs: pd.DataFrame, name_a: str, name_b: str, top: int) -> go.Figure:
    """GNQ_total of each text in run a (x) against run b (y), the diagonal y = x, texts in either
    run's top ``top`` ringed.  customdata: [example id in b, text, rank a, rank b]."""
    title = f"GNQ_total: {base.escape(name_a)} vs. {base.escape(name_b)}"
    if pairs.empty:
        return base.empty_figure(title)
    groups = pairs["group"].map(base.group_name)
    colors = base.group_colors(groups)
    fig = go.Figure()
    lo = float(min(pairs["gnq_a"].min(), pairs["gnq_b"].min()))
    hi = float(max(pairs["gnq_a"].max(), pairs["gnq_b"].max()))
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="same GNQ in both", hoverinfo="skip",
                             line={"color": base.NEUTRAL, "width": 1, "dash": "dot"}))
    for g in sorted(groups.unique()):
        part = pairs[groups == g]
        top_either = (part["rank_a"] <= top) | (part["rank_b"] <= top)
        custom = [[int(r.example_id_b), base.short_text(r.text), int(r.rank_a), int(r.rank_b)]
                  for r in part.itertuples(index=False)]
        fig.add_trace(base.scatter_cls(len(part))(
            x=part["gnq_a"], y=part["gnq_b"], mode="markers", name=base.escape(g), customdata=custom,
            marker={"color": colors.get(g, base.OTHER_COLOR), "size": np.where(top_either, 10, 6),
                    "line": {"width": np.where(top_either, 1.5, 0), "color": base.ROLE_COLORS["selected"]}},
            hovertemplate="#%{customdata[0]} %{customdata[1]}<br>rank %{customdata[2]} → %{customdata[3]}"
                          "<extra></extra>"))
    log = base.use_log(pd.concat([pairs["gnq_a"], pairs["gnq_b"]]))
    return base.layout(fig, title, f"GNQ_total in {base.escape(name_a)}",
                       f"GNQ_total in {base.escape(name_b)}", log_x=log, log_y=log)
