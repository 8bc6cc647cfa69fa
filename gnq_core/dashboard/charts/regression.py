"""The §4 2D regression figures: the data, gradient space with the ellipses, the rankings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gnq_core.dashboard.charts import base


def _as_array(values: Any, dims: int = 1) -> np.ndarray:
    arr = np.asarray(values if values is not None else [], dtype=float)
    return arr.reshape(-1, 2) if dims == 2 else arr.reshape(-1)


def _point_name(j: int, label_offset: int) -> str:
    return f"point {j + label_offset}"


def regression_data(x: Any, y: Any, w: float, b: float, selected: int | None, gnq_values: Any, *,
                    label_offset: int = 1) -> go.Figure:
    """The data and the line y = w·x + b (paper Fig. 1a): marker size and colour by GNQ, the
    residuals dotted, the selected point ringed.  customdata: [index j, name, GNQ, residual]."""
    title = "Data and regression line"
    xs, ys = _as_array(x), _as_array(y)
    if xs.size == 0 or xs.size != ys.size:
        return base.empty_figure(title)
    n = xs.size
    gnq = _as_array(gnq_values) if gnq_values is not None else np.full(n, np.nan)
    if gnq.size != n:
        raise ValueError(f"regression_data: {n} points but {gnq.size} GNQ values")
    fit = w * xs + b
    log_c = base.use_log(gnq)
    colour = np.log10(gnq) if log_c else gnq
    finite = np.isfinite(colour)
    if finite.any() and np.ptp(colour[finite]) > 0:
        size = 10 + 20 * (colour - np.nanmin(colour[finite])) / np.ptp(colour[finite])
    else:
        size = np.full(n, 16.0)
    size = np.where(np.isfinite(size), size, 10.0)
    names = [_point_name(j, label_offset) for j in range(n)]
    custom = [[j, names[j], base.fmt(gnq[j]), base.fmt(ys[j] - fit[j])] for j in range(n)]
    lo, hi = float(xs.min()), float(xs.max())
    pad = 0.1 * (hi - lo) if hi > lo else 1.0
    line_x = np.array([lo - pad, hi + pad])
    fig = go.Figure()
    res_x = [v for j in range(n) for v in (xs[j], xs[j], None)]
    res_y = [v for j in range(n) for v in (ys[j], fit[j], None)]
    fig.add_trace(go.Scatter(x=res_x, y=res_y, mode="lines", name="residuals", hoverinfo="skip",
                             line={"color": base.NEUTRAL, "width": 1, "dash": "dot"}))
    fig.add_trace(go.Scatter(x=line_x, y=w * line_x + b, mode="lines", name=f"y = {w:.3g}·x {b:+.3g}",
                             line={"color": base.ROLE_COLORS["bottom"], "width": 2}, hoverinfo="skip"))
    marker: dict[str, Any] = {"size": size, "line": {"width": 1, "color": base.NEUTRAL}}
    if finite.any():
        marker.update(color=np.where(finite, colour, np.nan), colorscale="Viridis", showscale=True,
                      colorbar={"title": {"text": "log10 GNQ" if log_c else "GNQ"}})
    else:
        marker.update(color=base.GROUP_PALETTE[0])
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers+text", text=[str(j + label_offset) for j in range(n)],
                             textposition="top center", name="data", customdata=custom, marker=marker,
                             hovertemplate=("%{customdata[1]}: x %{x:.3g}, y %{y:.3g}<br>GNQ %{customdata[2]}"
                                            " · residual %{customdata[3]}<extra></extra>")))
    if selected is not None and 0 <= int(selected) < n:
        j = int(selected)
        fig.add_trace(go.Scatter(x=[xs[j]], y=[ys[j]], mode="markers", name=f"selected: {names[j]}",
                                 customdata=[custom[j]],
                                 hovertemplate="%{customdata[1]} (selected)<extra></extra>",
                                 marker={"symbol": "circle-open", "size": float(size[j]) + 12,
                                         "color": base.ROLE_COLORS["selected"], "line": {"width": 3}}))
    fig = base.layout(fig, title, "x", "y")
    # the colour bar takes the right edge: the legend goes above the plot, not on top of it
    fig.update_layout(legend={"orientation": "h", "x": 0, "y": 1.02, "xanchor": "left", "yanchor": "bottom"},
                      margin={"t": 90})
    return fig


def gradient_space(G: Any, selected: int | None, ellipse_selected: Any,
                   ellipse_others: Mapping[int, Any] | None = None, strip_halfwidth: float | None = None, *,
                   label_offset: int = 1) -> go.Figure:
    """Per-point gradients g_j = (∂ℓ/∂w, ∂ℓ/∂b) as arrows from the origin (paper Fig. 1b/2b).

    ``ellipse_selected`` (points of {g : gᵀ S₋ⱼ⁻¹ g = 1} for the selected j) is drawn bold,
    ``ellipse_others`` {k: points} faint; ``strip_halfwidth`` = √(2τ) shades the loss-threshold
    strip |∂ℓ/∂b| ≤ √(2τ).  Equal aspect ratio.  customdata: [index j, name, ∂ℓ/∂w, ∂ℓ/∂b]."""
    title = "Gradient space"
    g = _as_array(G, dims=2)
    if g.shape[0] == 0:
        return base.empty_figure(title)
    n = g.shape[0]
    sel = int(selected) if selected is not None and 0 <= int(selected) < n else None
    names = [_point_name(j, label_offset) for j in range(n)]
    ell_sel = _as_array(ellipse_selected, dims=2) if ellipse_selected is not None else np.empty((0, 2))
    others = {int(k): _as_array(v, dims=2) for k, v in (ellipse_others or {}).items()}
    everything = np.vstack([g, np.zeros((1, 2)), ell_sel, *others.values()])
    everything = everything[np.isfinite(everything).all(axis=1)]
    x_lo, x_hi = float(everything[:, 0].min()), float(everything[:, 0].max())
    pad = 0.08 * max(x_hi - x_lo, float(np.ptp(everything[:, 1])), 1e-12)
    x_lo, x_hi = x_lo - pad, x_hi + pad
    fig = go.Figure()
    if strip_halfwidth is not None and np.isfinite(strip_halfwidth) and strip_halfwidth > 0:
        h = float(strip_halfwidth)
        fig.add_trace(go.Scatter(x=[x_lo, x_hi, x_hi, x_lo, x_lo], y=[-h, -h, h, h, -h], mode="lines",
                                 fill="toself", fillcolor="rgba(255, 127, 14, 0.15)",
                                 line={"color": "rgba(255, 127, 14, 0.6)", "width": 1, "dash": "dash"},
                                 name=f"loss ≤ τ strip: |∂ℓ/∂b| ≤ √(2τ) = {h:.3g}", hoverinfo="name"))
    first = True
    for k, pts in sorted(others.items()):
        if pts.shape[0] == 0 or k == sel:
            continue
        closed = np.vstack([pts, pts[:1]])
        who = names[k] if 0 <= k < n else f"point {k + label_offset}"
        fig.add_trace(go.Scatter(x=closed[:, 0], y=closed[:, 1], mode="lines", legendgroup="others",
                                 name="ellipses leaving out other points", showlegend=first,
                                 line={"color": "rgba(214, 39, 40, 0.35)", "width": 1},
                                 hovertemplate=f"ellipse of S without {who}<extra></extra>"))
        first = False
    if ell_sel.shape[0]:
        closed = np.vstack([ell_sel, ell_sel[:1]])
        who = names[sel] if sel is not None else "the selected point"
        fig.add_trace(go.Scatter(x=closed[:, 0], y=closed[:, 1], mode="lines",
                                 name=f"ellipse of S without {who}",
                                 line={"color": base.GROUP_PALETTE[0], "width": 3},
                                 hovertemplate=f"gᵀ S⁻¹ g = 1, S without {who}<extra></extra>"))
    seg_x = [v for j in range(n) for v in (0.0, g[j, 0], None)]
    seg_y = [v for j in range(n) for v in (0.0, g[j, 1], None)]
    fig.add_trace(go.Scatter(x=seg_x, y=seg_y, mode="lines", name="gradients", hoverinfo="skip",
                             line={"color": base.NEUTRAL, "width": 1.5}, showlegend=False))
    custom = [[j, names[j], base.fmt(g[j, 0]), base.fmt(g[j, 1])] for j in range(n)]
    colors = [base.ROLE_COLORS["selected"] if j == sel else base.GROUP_PALETTE[1] for j in range(n)]
    fig.add_trace(go.Scatter(x=g[:, 0], y=g[:, 1], mode="markers+text", name="g_j",
                             text=[str(j + label_offset) for j in range(n)], textposition="top right",
                             customdata=custom, marker={"color": colors, "size": 10},
                             hovertemplate=("%{customdata[1]}: ∂ℓ/∂w %{customdata[2]}, ∂ℓ/∂b %{customdata[3]}"
                                            "<extra></extra>")))
    if n <= base.MAX_ARROWS:
        for j in range(n):
            if np.isfinite(g[j]).all():
                fig.add_annotation(x=g[j, 0], y=g[j, 1], ax=0, ay=0, xref="x", yref="y", axref="x", ayref="y",
                                   showarrow=True, arrowhead=2, arrowsize=1, arrowwidth=1.5, text="",
                                   arrowcolor=colors[j])
    fig = base.layout(fig, title, "∂ℓ/∂w", "∂ℓ/∂b")
    fig.update_xaxes(range=[x_lo, x_hi], zeroline=True)
    fig.update_yaxes(scaleanchor="x", scaleratio=1, zeroline=True)
    return fig


def ranking_comparison(gnq_values: Any, loss_values: Any, *, label_offset: int = 1) -> go.Figure:
    """The points ranked by GNQ (highest first) next to the ranking by loss (lowest first, the
    membership-inference order), one colour per point in both panels (paper Fig. 2).
    customdata: [index j, name, GNQ rank, loss rank, GNQ, loss]."""
    title = "Ranking by GNQ vs. by loss"
    gnq, loss = _as_array(gnq_values), _as_array(loss_values)
    if gnq.size == 0 or loss.size == 0:
        return base.empty_figure(title)
    if gnq.size != loss.size:
        raise ValueError(f"ranking_comparison: {gnq.size} GNQ values but {loss.size} losses")
    n = gnq.size
    names = [_point_name(j, label_offset) for j in range(n)]
    by_gnq = np.lexsort((np.arange(n), np.where(np.isfinite(gnq), -gnq, np.inf)))
    by_loss = np.lexsort((np.arange(n), np.where(np.isfinite(loss), loss, np.inf)))
    rank_gnq, rank_loss = np.empty(n, int), np.empty(n, int)
    rank_gnq[by_gnq], rank_loss[by_loss] = np.arange(1, n + 1), np.arange(1, n + 1)
    custom = np.array([[j, names[j], int(rank_gnq[j]), int(rank_loss[j]), base.fmt(gnq[j]), base.fmt(loss[j])]
                       for j in range(n)], dtype=object)
    colors = [base.GROUP_PALETTE[j % len(base.GROUP_PALETTE)] for j in range(n)]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.18,
                        subplot_titles=("by GNQ (highest first)", "by loss (lowest first, MIA-style)"))
    hover = ("%{customdata[1]}: GNQ rank %{customdata[2]} (GNQ %{customdata[4]}), "
             "loss rank %{customdata[3]} (loss %{customdata[5]})<extra></extra>")
    for col, order, values in ((1, by_gnq, gnq), (2, by_loss, loss)):
        fig.add_trace(go.Bar(x=values[order], y=[names[j] for j in order], orientation="h",
                             customdata=custom[order].tolist(), marker={"color": [colors[j] for j in order]},
                             name="GNQ" if col == 1 else "loss", showlegend=False, hovertemplate=hover),
                      row=1, col=col)
        fig.update_yaxes(categoryorder="array", categoryarray=[names[j] for j in order], autorange="reversed",
                         row=1, col=col)
    fig.update_xaxes(title_text="GNQ", type="log" if base.use_log(gnq) else "linear", row=1, col=1)
    fig.update_xaxes(title_text="loss", type="log" if base.use_log(loss) else "linear", row=1, col=2)
    fig.update_yaxes(title_text="point")
    fig.update_layout(title=title, hovermode="closest", bargap=0.25)
    return fig
