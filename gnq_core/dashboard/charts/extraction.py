"""Extraction-attack success per GNQ_total quantile bin (paper Fig. 6)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gnq_core.dashboard.charts import base


def extraction_vs_quantile(bins_frame: pd.DataFrame, *, texts: Mapping[int, str] | None = None,
                           score_label: str = "GNQ_total", log_y2: bool | None = None) -> go.Figure:
    """Extraction success rate per score quantile bin (bars, %, left) and the bin's mean score
    (line, right, log when it spans decades) — paper Fig. 6.  Input: ``analysis.quantile_bins``.

    customdata: [id of the bin's highest-scoring example (when the frame has example_ids),
    its text, n, lo, hi, mean match]."""
    title = f"Extraction success by {score_label} quantile"
    need = {"bin", "success_rate", "mean_score"}
    if bins_frame is None or bins_frame.empty or not need <= set(bins_frame.columns):
        return base.empty_figure(title)
    b = bins_frame.sort_values("bin")
    text_of = {int(k): v for k, v in texts.items()} if texts is not None else {}
    custom = []
    for r in b.to_dict("records"):
        ids = r.get("example_ids")
        best = int(ids[-1]) if isinstance(ids, list | tuple | np.ndarray) and len(ids) else None
        custom.append([best, base.short_text(text_of.get(best)) if best is not None else "",
                       int(r.get("n", 0)),
                       base.fmt(r.get("lo")), base.fmt(r.get("hi")), base.fmt(r.get("mean_match"), ".2f")])
    if log_y2 is None:
        log_y2 = base.use_log(b["mean_score"])
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=b["bin"], y=100 * b["success_rate"].astype(float), name="extraction success",
                         customdata=custom, marker={"color": base.GROUP_PALETTE[0]},
                         hovertemplate=(f"bin %{{x}}: %{{customdata[2]}} examples, "
                                        f"{base.escape(score_label)} %{{customdata[3]}} – %{{customdata[4]}}"
                                        "<br>success %{y:.1f}% · "
                                        "mean match %{customdata[5]}<br>highest: #%{customdata[0]} "
                                        "%{customdata[1]}<extra></extra>")),
                  secondary_y=False)
    fig.add_trace(go.Scatter(x=b["bin"], y=b["mean_score"], mode="lines+markers",
                             name=f"mean {base.escape(score_label)}", customdata=custom,
                             line={"color": base.GROUP_PALETTE[1], "width": 2.5},
                             hovertemplate=(f"bin %{{x}}: mean {base.escape(score_label)} %{{y:.4g}}"
                                            "<extra></extra>")),
                  secondary_y=True)
    fig.update_layout(title=title, hovermode="closest", bargap=0.15)
    fig.update_xaxes(title_text=f"{base.escape(score_label)} quantile bin (1 = lowest)", tickmode="linear",
                     dtick=1)
    fig.update_yaxes(title_text="extraction success (%)", range=[0, 105], secondary_y=False)
    fig.update_yaxes(title_text=f"mean {base.escape(score_label)}", type="log" if log_y2 else "linear",
                     secondary_y=True, showgrid=False)
    return fig
