"""What every figure shares: colours, label escaping, log axes, point axes.

No figure names a template or a background: a figure takes plotly's default template, which the
dashboard is Streamlit's (``st.plotly_chart(theme="streamlit")`` draws it in the viewer's light or
dark theme). Fixed colours are mid-tones, readable on both backgrounds."""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.colors
import plotly.graph_objects as go

GROUP_PALETTE: list[str] = list(plotly.colors.qualitative.D3)
ROLE_COLORS = {"top": "#D6404E", "bottom": "#3A7DC9", "selected": "#9467BD"}
ROLE_DASH = {"top": "solid", "bottom": "dot", "selected": "dash"}
NEUTRAL = "#888888"        # reference lines and outlines: mid grey, seen on white and on near-black
OTHER_COLOR = "rgba(150, 150, 150, 0.35)"
BAND_COLOR = "rgba(150, 150, 150, 0.25)"  # grey, as the pages say
NO_GROUP = "(none)"
# A log axis (only past LOG_SPAN, so at least two decades) labels its powers of ten alone: Plotly's
# own choice over a few decades adds small "2" and "5" labels that read as "2 1000 5" down the axis.
LOG_TICKS = {"tickformat": "~g", "dtick": 1}
TEXT_LIMIT = 80
LOG_SPAN = 100.0
GL_THRESHOLD = 2000        # above this many markers a scatter uses WebGL
MAX_ARROWS = 30            # arrowheads in gradient space only for small examples

LABELS = {"gnq_total": "GNQ_total", "gnq_max": "GNQ_max", "gnq_last": "GNQ (last point)",
          "gnq_mean": "GNQ_mean", "gnq": "GNQ", "loss_last": "loss (last point)", "loss": "loss",
          "self_influence_last": "self-influence ‖g‖² (last point)", "self_influence": "self-influence ‖g‖²"}


# --------------------------------------------------------------------------- helpers
def escape(value: Any) -> str:
    """A string safe to show in a plotly hover label / legend (plotly renders some HTML tags)."""
    return html.escape("" if value is None else str(value), quote=False)


def short_text(text: Any, limit: int = TEXT_LIMIT) -> str:
    """Whitespace collapsed, cut to ``limit`` characters (with "…"), then HTML-escaped."""
    if text is None or (isinstance(text, float) and np.isnan(text)):
        return ""
    flat = " ".join(str(text).split())
    if len(flat) > limit:
        flat = flat[: max(0, limit - 1)].rstrip() + "…"
    return escape(flat)


def use_log(values: Iterable[Any]) -> bool:
    """True when the finite values are all > 0 and max/min exceeds ``LOG_SPAN``."""
    v = pd.to_numeric(pd.Series(list(values), dtype=object), errors="coerce").astype(float).to_numpy()
    v = v[np.isfinite(v)]
    if v.size == 0 or (v <= 0).any():
        return False
    return bool(v.max() / v.min() > LOG_SPAN)


def group_name(value: Any) -> str:
    return NO_GROUP if value is None or (isinstance(value, float) and np.isnan(value)) else str(value)


def groups_of(frame: pd.DataFrame) -> pd.Series:
    """Each row's group name (``NO_GROUP`` without a group column)."""
    return frame["group"].map(group_name) if "group" in frame.columns else pd.Series(NO_GROUP, frame.index)


def group_colors(groups: Iterable[Any]) -> dict[str, str]:
    """Group name → colour: the distinct names, sorted, take the palette in order.

    Pass the run's full list of groups (e.g. ``totals["group"]``) and hand the result to the
    builders' ``colors`` argument to keep colours identical across figures showing subsets.
    """
    names = sorted({group_name(g) for g in groups})
    return {g: GROUP_PALETTE[i % len(GROUP_PALETTE)] for i, g in enumerate(names)}


def label(column: str) -> str:
    return LABELS.get(column, column)


def empty_figure(title: str = "", message: str = "no data") -> go.Figure:
    """A blank figure with a centred message, for inputs with nothing to draw."""
    fig = go.Figure()
    fig.add_annotation(text=escape(message), x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font={"size": 16, "color": NEUTRAL})
    fig.update_layout(title=escape(title) or None,
                      xaxis={"visible": False}, yaxis={"visible": False})
    return fig


def layout(fig: go.Figure, title: str, xtitle: str, ytitle: str, *, log_x: bool = False,
            log_y: bool = False) -> go.Figure:
    fig.update_layout(title=title, hovermode="closest",
                      legend={"itemsizing": "constant"}, margin={"t": 60, "r": 20, "b": 50, "l": 60})
    # A log axis labels its in-between ticks with the leading digit alone ("2, 5, 1000, 2, 5"):
    # "~g" writes every tick as its whole value (200, 500, 1000, 2000).
    fig.update_xaxes(title_text=xtitle, type="log" if log_x else "linear", **LOG_TICKS if log_x else {})
    fig.update_yaxes(title_text=ytitle, type="log" if log_y else "linear", **LOG_TICKS if log_y else {})
    return fig


def texts_for(frame: pd.DataFrame, texts: Mapping[int, str] | None) -> dict[int, str]:
    """example_id → text, from ``texts`` or the frame's own text column."""
    if texts is not None:
        return {int(k): v for k, v in texts.items()}
    if "text" in frame.columns and "example_id" in frame.columns:
        first = frame.drop_duplicates("example_id")
        return dict(zip(first["example_id"].astype(int), first["text"], strict=True))
    return {}


def fmt(value: Any, spec: str = ".4g") -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "–"
    return "–" if not np.isfinite(v) else format(v, spec)


def rgba(color: str, alpha: float) -> str:
    """'#RRGGBB' or 'rgb(r, g, b)' with an alpha channel."""
    if color.startswith("#"):
        r, g, b = plotly.colors.hex_to_rgb(color)
    elif color.startswith("rgb"):
        r, g, b = (float(v) for v in color[color.index("(") + 1: color.index(")")].split(",")[:3])
    else:
        return color
    return f"rgba({r:.0f}, {g:.0f}, {b:.0f}, {alpha})"


def scatter_cls(n: int) -> type[go.Scatter] | type[go.Scattergl]:
    return go.Scattergl if n > GL_THRESHOLD else go.Scatter


def point_axis(fig: go.Figure, points: Sequence[int], labels: Sequence[str], **where: Any) -> None:
    """x is the point number; its ticks show the (escaped) point labels."""
    fig.update_xaxes(tickmode="array", tickvals=list(points), ticktext=[escape(x) for x in labels], **where)


def point_labels(*frames: pd.DataFrame | None) -> pd.Series:
    """point → label over all given frames (label = str(point) where a frame has none)."""
    parts = []
    for frame in frames:
        if frame is None or frame.empty or "point" not in frame.columns:
            continue
        lab = frame["label"].astype(str) if "label" in frame.columns else frame["point"].astype(str)
        parts.append(pd.DataFrame({"point": frame["point"].astype(int), "label": lab}))
    if not parts:
        return pd.Series(dtype=object)
    both = pd.concat(parts).drop_duplicates("point").sort_values("point")
    return pd.Series(both["label"].to_numpy(), index=both["point"].to_numpy())


_TAG = re.compile(r"<[^>]+>")


def _plain_text(value: Any) -> str:
    return html.unescape(_TAG.sub(" ", "" if value is None else str(value))).strip()


def describe(fig: go.Figure, limit: int = 6) -> str:
    """A text alternative to a figure, for screen readers and for anyone who cannot tell its colours
    apart: its title, what each axis shows and each named series with its number of marks."""
    layout = fig.layout
    parts = [_plain_text(layout.title.text) or "Chart"]
    axes = []
    for name in sorted(k for k in layout.to_plotly_json() if re.fullmatch(r"[xy]axis\d*", k)):
        title = _plain_text(layout[name].title.text)
        if title:
            axes.append(f"{name[0]}: {title}{' (log scale)' if layout[name].type == 'log' else ''}")
    if axes:
        parts.append("; ".join(axes))
    series = []
    for trace in fig.data:
        name = _plain_text(trace.name)
        if not name or trace.showlegend is False or (name == NO_GROUP and len(fig.data) == 1):
            continue  # one series of texts without a group is no series to name
        values = next((v for v in (getattr(trace, a, None) for a in ("x", "y", "values"))
                       if v is not None), ())
        if trace.type == "scatter" and "markers" not in (trace.mode or "markers"):
            series.append(f"{name} (a line)")  # a reference line: its two end points are no data
            continue
        marks = sum(v is not None for v in values)  # line breaks (None) are no marks
        unit = "bar" if trace.type in ("bar", "histogram") else "point"
        series.append(f"{name} ({marks:,} {unit}{'' if marks == 1 else 's'})")
    if series:
        more = f" and {len(series) - limit} more" if len(series) > limit else ""
        parts.append("series: " + ", ".join(series[:limit]) + more)
    return ". ".join(parts) + "."
