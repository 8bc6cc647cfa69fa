"""Plotly figures of the predictive-power analysis, shared by the dashboard's Extraction page and
the HTML report (``gnq report``): pure functions from analysis.predictive's frames to figures."""

from __future__ import annotations

import html

import pandas as pd
import plotly.graph_objects as go

from gnq_core.analysis.predictive import ALL, Predictive

TEMPLATE = "plotly_white"


def roc_figure(points: pd.DataFrame, result: Predictive | pd.DataFrame, *, log_fpr: bool = False,
               template: str | None = TEMPLATE, positive: str = "extracted",
               negative: str = "kept") -> go.Figure:
    """One ROC curve per signal (``predictive.roc_points``), legend ordered by AUC with its
    interval; the diagonal is chance.  ``result``: analysis.predictive's result, or the rows of an
    analysis.evidence table to draw (one per signal, scope "all"), e.g. membership's.
    ``log_fpr``: the low-FPR region the attack literature reads (10⁻³ to 1).  ``positive`` /
    ``negative``: what the two outcomes are called in the axis titles.  ``template=None``: plotly's
    default template (the dashboard's theme, light or dark); the report's white page keeps
    ``TEMPLATE``."""
    fig = go.Figure()
    table = result.table[result.table["scope"] == ALL] if isinstance(result, Predictive) else result
    overall = table[table["auc"].notna()].sort_values("auc", ascending=False)
    for rank, (_, row) in enumerate(overall.iterrows()):
        curve = points[points["signal"] == row["signal"]]
        if curve.empty:
            continue
        auc = f"AUC {row['auc']:.2f} [{row['auc lo']:.2f}, {row['auc hi']:.2f}]"
        name = html.escape(f"{row['label']} ({auc})", quote=False)
        fig.add_trace(go.Scatter(x=curve["fpr"], y=curve["tpr"], mode="lines", name=name,
                                 line={"width": 3 if rank == 0 else 1.5, "shape": "hv"},
                                 hovertemplate="FPR %{x:.3f}<br>TPR %{y:.3f}<extra>" + name + "</extra>"))
    lo = 1e-3 if log_fpr else 0.0
    fig.add_trace(go.Scatter(x=[lo, 1], y=[lo, 1], mode="lines", name="chance",
                             line={"dash": "dot", "color": "grey", "width": 1}, hoverinfo="skip"))
    if template is not None:
        fig.update_layout(template=template)
    fig.update_layout(title=f"Which signal tells the {positive} texts apart? (ROC)",
                      xaxis_title=f"false-positive rate (share of {negative} texts flagged)"
                                  + (", log scale" if log_fpr else ""),
                      yaxis_title=f"true-positive rate (share of {positive} texts flagged)",
                      legend={"font": {"size": 10}}, height=460, margin={"l": 60, "r": 20, "t": 50, "b": 50})
    if log_fpr:
        fig.update_xaxes(type="log", range=[-3, 0])
    else:
        fig.update_xaxes(range=[0, 1])
    fig.update_yaxes(range=[0, 1.02])
    if not fig.data or len(fig.data) == 1:
        fig.add_annotation(text=f"no signal can be scored (it needs both {positive} and {negative} texts)",
                           showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    return fig
