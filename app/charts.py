"""Plotly figure builders for the dashboard: pure functions from frames/arrays to figures.

No Streamlit here; every builder returns a ``plotly.graph_objects.Figure`` and never raises on
empty input (it answers a figure saying "no data").  Conventions shared by all builders:

* ``customdata[0]`` of every per-example trace is the example id (for the §4 regression
  figures: the point's 0-based index), so a click or a box selection maps back to an example.
  Aggregate marks (histogram bars, quantile bins) carry their highest-scoring example's id
  there (``None`` for an empty bin), followed by the text and the aggregate's own numbers.
* Texts, group names and point labels are user data: they go into hover labels only as
  HTML-escaped strings (``<``, ``>``, ``&``), shortened to ``TEXT_LIMIT`` characters.
* An axis is logarithmic when its values are all positive and span more than a factor 100
  (``use_log``); builders take an explicit override where that matters.
* One template (``TEMPLATE``) and one group → colour map (``group_colors``) for all figures.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.colors
import plotly.graph_objects as go
from plotly.subplots import make_subplots

TEMPLATE = "plotly_white"
GROUP_PALETTE: list[str] = list(plotly.colors.qualitative.D3)
ROLE_COLORS = {"top": "#B2182B", "bottom": "#2166AC", "selected": "#111111"}
ROLE_DASH = {"top": "solid", "bottom": "dot", "selected": "dash"}
OTHER_COLOR = "rgba(150, 150, 150, 0.35)"
BAND_COLOR = "rgba(150, 150, 150, 0.25)"  # grey, as the pages say
NO_GROUP = "(none)"
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
                       font={"size": 16, "color": "#888"})
    fig.update_layout(template=TEMPLATE, title=escape(title) or None,
                      xaxis={"visible": False}, yaxis={"visible": False})
    return fig


def _layout(fig: go.Figure, title: str, xtitle: str, ytitle: str, *, log_x: bool = False,
            log_y: bool = False) -> go.Figure:
    fig.update_layout(template=TEMPLATE, title=title, hovermode="closest",
                      legend={"itemsizing": "constant"}, margin={"t": 60, "r": 20, "b": 50, "l": 60})
    fig.update_xaxes(title_text=xtitle, type="log" if log_x else "linear")
    fig.update_yaxes(title_text=ytitle, type="log" if log_y else "linear")
    return fig


def _texts_for(frame: pd.DataFrame, texts: Mapping[int, str] | None) -> dict[int, str]:
    """example_id → text, from ``texts`` or the frame's own text column."""
    if texts is not None:
        return {int(k): v for k, v in texts.items()}
    if "text" in frame.columns and "example_id" in frame.columns:
        first = frame.drop_duplicates("example_id")
        return dict(zip(first["example_id"].astype(int), first["text"], strict=True))
    return {}


def _fmt(value: Any, spec: str = ".4g") -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "–"
    return "–" if not np.isfinite(v) else format(v, spec)


def _rgba(color: str, alpha: float) -> str:
    """'#RRGGBB' or 'rgb(r, g, b)' with an alpha channel."""
    if color.startswith("#"):
        r, g, b = plotly.colors.hex_to_rgb(color)
    elif color.startswith("rgb"):
        r, g, b = (float(v) for v in color[color.index("(") + 1: color.index(")")].split(",")[:3])
    else:
        return color
    return f"rgba({r:.0f}, {g:.0f}, {b:.0f}, {alpha})"


def _scatter_cls(n: int) -> type[go.Scatter] | type[go.Scattergl]:
    return go.Scattergl if n > GL_THRESHOLD else go.Scatter


def _point_axis(fig: go.Figure, points: Sequence[int], labels: Sequence[str], **where: Any) -> None:
    """x is the point number; its ticks show the (escaped) point labels."""
    fig.update_xaxes(tickmode="array", tickvals=list(points), ticktext=[escape(x) for x in labels], **where)


def _point_labels(*frames: pd.DataFrame | None) -> pd.Series:
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


# --------------------------------------------------------------------------- overview
def gnq_histogram(totals: pd.DataFrame, column: str = "gnq_total", log_x: bool | None = None,
                  bins: int = 50) -> go.Figure:
    """Distribution of ``column`` over examples; on log10 values when they span decades.

    Bars carry customdata [example id of the bin's highest value, its text, count, lo, hi]
    (lo/hi in the column's own units), so a click can list the bin's examples.
    """
    name = label(column)
    title = f"Distribution of {name}"
    if totals.empty or column not in totals.columns:
        return empty_figure(title)
    values = pd.to_numeric(totals[column], errors="coerce").astype(float)
    keep = np.isfinite(values)
    if log_x is None:
        log_x = use_log(values[keep])
    if log_x:
        keep &= values > 0
    if not keep.any():
        return empty_figure(title, "no data" if not log_x else "no positive values to show on a log scale")
    frame = totals.loc[keep]
    raw = values[keep].to_numpy()
    shown = np.log10(raw) if log_x else raw
    ids = frame["example_id"].astype(int).to_numpy() if "example_id" in frame.columns else np.arange(len(raw))
    text_of = _texts_for(frame, None)
    edges = np.histogram_bin_edges(shown, bins=max(1, min(int(bins), len(np.unique(shown)) * 2)))
    which = np.clip(np.searchsorted(edges, shown, side="right") - 1, 0, len(edges) - 2)
    counts = np.bincount(which, minlength=len(edges) - 1)
    custom = []
    for i in range(len(edges) - 1):
        members = np.flatnonzero(which == i)
        lo, hi = (10 ** edges[i], 10 ** edges[i + 1]) if log_x else (edges[i], edges[i + 1])
        if members.size:
            best = int(ids[members[np.argmax(raw[members])]])
            custom.append([best, short_text(text_of.get(best)), int(counts[i]), lo, hi])
        else:
            custom.append([None, "", 0, lo, hi])
    fig = go.Figure(go.Bar(
        x=(edges[:-1] + edges[1:]) / 2, y=counts, width=np.diff(edges), customdata=custom,
        marker={"color": GROUP_PALETTE[0], "line": {"width": 0}}, name=name,
        hovertemplate=(f"{escape(name)} %{{customdata[3]:.4g}} – %{{customdata[4]:.4g}}<br>"
                       "%{y} examples<br>highest: #%{customdata[0]} %{customdata[1]}<extra></extra>")))
    fig.update_layout(bargap=0.02)
    return _layout(fig, title, f"{name} (log10)" if log_x else name, "examples")


def gnq_vs_loss(totals: pd.DataFrame, max_points: int = 5000, seed: int = 0, *,
                colors: Mapping[str, str] | None = None, keep_top: int = 50) -> go.Figure:
    """GNQ_total against the last point's loss, one colour per group (the MIA comparison).

    Drawn on at most ``max_points`` examples: the ``keep_top`` highest GNQ_total always, the
    rest a seeded random sample.  customdata: [example id, text, group, rank, extraction match].
    """
    title = "GNQ_total vs. loss"
    need = {"example_id", "gnq_total", "loss_last"}
    if totals.empty or not need <= set(totals.columns):
        return empty_figure(title)
    gnq = pd.to_numeric(totals["gnq_total"], errors="coerce").astype(float)
    loss = pd.to_numeric(totals["loss_last"], errors="coerce").astype(float)
    frame = totals.loc[np.isfinite(gnq) & np.isfinite(loss)]
    if frame.empty:
        return empty_figure(title)
    n_all = len(frame)
    if n_all > max_points:
        order = frame.assign(_g=-gnq[frame.index]).sort_values(["_g", "example_id"], kind="mergesort")
        top = order.index[: min(keep_top, max_points)]
        rest = order.index[min(keep_top, max_points):]
        rng = np.random.default_rng(seed)
        pick = rng.choice(len(rest), size=max(0, max_points - len(top)), replace=False)
        frame = frame.loc[top.append(rest[np.sort(pick)])]
    log_x, log_y = use_log(gnq[frame.index]), use_log(loss[frame.index])
    groups = frame["group"].map(group_name) if "group" in frame.columns else pd.Series(NO_GROUP, frame.index)
    colors = dict(colors) if colors is not None else group_colors(groups)
    cls = _scatter_cls(len(frame))
    fig = go.Figure()
    for g in sorted(groups.unique()):
        part = frame.loc[groups == g]
        custom = [[int(r.example_id), short_text(r.text if "text" in part.columns else None), escape(g),
                   _fmt(getattr(r, "rank", None), ".0f"), _fmt(getattr(r, "extraction_match", None), ".2f")]
                  for r in part.itertuples(index=False)]
        fig.add_trace(cls(
            x=gnq[part.index], y=loss[part.index], mode="markers", name=escape(g), customdata=custom,
            marker={"color": colors.get(g, OTHER_COLOR), "size": 6, "opacity": 0.75},
            hovertemplate=("#%{customdata[0]} (%{customdata[2]}) rank %{customdata[3]}<br>"
                           "%{customdata[1]}<br>"
                           "GNQ_total %{x:.4g} · loss %{y:.4g} · extraction match %{customdata[4]}"
                           "<extra></extra>")))
    fig = _layout(fig, title, label("gnq_total"), label("loss_last"), log_x=log_x, log_y=log_y)
    if len(frame) < n_all:
        kept = min(keep_top, max_points)
        fig.add_annotation(text=f"showing {len(frame):,} of {n_all:,} examples (top {kept} "
                                "by GNQ_total always shown)", xref="paper", yref="paper", x=1, y=1.06,
                           showarrow=False, xanchor="right", font={"size": 11, "color": "#666"})
    return fig


# --------------------------------------------------------------------------- trajectories
def _role_of(ids: Sequence[int], top: Sequence[int], bottom: Sequence[int],
             selected: Sequence[int]) -> dict[int, str]:
    roles: dict[int, str] = {}
    for role, members in (("bottom", bottom), ("top", top), ("selected", selected)):  # later wins
        for i in members:
            roles[int(i)] = role
    present = {int(i) for i in ids}
    return {i: r for i, r in roles.items() if i in present}


def _lines(part: pd.DataFrame, text_of: Mapping[int, str],
           labels: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x, y, customdata for many examples' lines in one trace, each line ended by a gap (NaN x/y).

    ``part`` has example_id, point, gnq and group (already mapped by ``group_name``)."""
    part = part.sort_values(["example_id", "point"], kind="mergesort")
    ids = part["example_id"].astype(int).to_numpy()
    m = len(ids)
    if m == 0:
        return np.empty(0), np.empty(0), np.empty((0, 4), dtype=object)
    starts = np.r_[True, ids[1:] != ids[:-1]]
    line_no = np.cumsum(starts) - 1                       # which line each row belongs to
    n_lines = int(line_no[-1]) + 1
    pos = np.arange(m) + line_no                          # rows shifted by the gaps before them
    size = m + n_lines
    xs, ys = np.full(size, np.nan), np.full(size, np.nan)
    points = part["point"].astype(int).to_numpy()
    xs[pos] = points
    ys[pos] = pd.to_numeric(part["gnq"], errors="coerce").astype(float).to_numpy()
    uniq = pd.unique(ids)
    short = {int(i): short_text(text_of.get(int(i))) for i in uniq}
    grp = part["group"].map(escape).to_numpy() if "group" in part.columns else np.full(m, NO_GROUP)
    lab = {int(p): escape(labels.get(p, p)) for p in np.unique(points)}
    # An object array, not a list of lists: plotly validates a list element by element (slow).
    cd = np.empty((size, 4), dtype=object)
    cd[:] = [None, "", "", ""]
    cd[pos, 0] = ids
    cd[pos, 1] = [short[i] for i in ids.tolist()]
    cd[pos, 2] = grp
    cd[pos, 3] = [lab[p] for p in points.tolist()]
    return xs, ys, cd


_LINE_HOVER = ("#%{customdata[0]} (%{customdata[2]})<br>%{customdata[1]}<br>"
               "%{customdata[3]}: GNQ %{y:.4g}<extra></extra>")


def trajectories(traj: pd.DataFrame, highlight_top: Sequence[int] = (), highlight_bottom: Sequence[int] = (),
                 selected: Sequence[int] = (), color_by_group: bool = False, band: pd.DataFrame | None = None,
                 *, texts: Mapping[int, str] | None = None, colors: Mapping[str, str] | None = None,
                 log_y: bool | None = None) -> go.Figure:
    """GNQ of each example across the run's points (paper Fig. 5).

    Thin lines for the other examples (grey, or faint group colours with ``color_by_group``);
    thick lines for the top / bottom / selected ids (role colours, or group colours with the
    role shown by the dash).  ``band`` (point, label, q10, q50, q90) adds a shaded 10–90 %
    band and a median line, for runs too large to draw every line.  Texts for the hover come
    from ``texts`` or a ``text`` column of ``traj``.
    """
    title = "GNQ per example across the run"
    has_traj = not traj.empty and {"example_id", "point", "gnq"} <= set(traj.columns)
    has_band = band is not None and not band.empty and {"point", "q10", "q50", "q90"} <= set(band.columns)
    if not has_traj and not has_band:
        return empty_figure(title)
    traj = traj if has_traj else pd.DataFrame(columns=["example_id", "point", "gnq", "group"])
    labels = _point_labels(traj if has_traj else None, band if has_band else None)
    values = list(pd.to_numeric(traj["gnq"], errors="coerce"))
    if has_band:
        values += [v for c in ("q10", "q50", "q90") for v in pd.to_numeric(band[c], errors="coerce")]
    if log_y is None:
        log_y = use_log(values)
    fig = go.Figure()
    if has_band:
        b = band.sort_values("point")
        bx = b["point"].astype(int).tolist()
        band_cd = [[None, "", "", escape(labels.get(p, p))] for p in bx]
        fig.add_trace(go.Scatter(x=bx, y=b["q90"], mode="lines", line={"width": 0}, name="90th percentile",
                                 legendgroup="band", showlegend=False, customdata=band_cd,
                                 hovertemplate="%{customdata[3]}: 90th percentile %{y:.4g}<extra></extra>"))
        fig.add_trace(go.Scatter(x=bx, y=b["q10"], mode="lines", line={"width": 0}, fill="tonexty",
                                 fillcolor=BAND_COLOR, name="10–90 % of examples", legendgroup="band",
                                 customdata=band_cd,
                                 hovertemplate="%{customdata[3]}: 10th percentile %{y:.4g}<extra></extra>"))
        fig.add_trace(go.Scatter(x=bx, y=b["q50"], mode="lines", name="median",
                                 line={"color": GROUP_PALETTE[0], "width": 2, "dash": "dash"},
                                 legendgroup="band", customdata=band_cd,
                                 hovertemplate="%{customdata[3]}: median %{y:.4g}<extra></extra>"))
    if has_traj:
        text_of = _texts_for(traj, texts)
        gcol = traj["group"].map(group_name) if "group" in traj.columns else pd.Series(NO_GROUP, traj.index)
        traj = traj.assign(group=gcol)
        colors = dict(colors) if colors is not None else group_colors(gcol)
        roles = _role_of(traj["example_id"].unique(), highlight_top, highlight_bottom, selected)
        rest = traj[~traj["example_id"].astype(int).isin(list(roles))]
        if not rest.empty:
            splits = ([(g, rest[rest["group"] == g]) for g in sorted(rest["group"].unique())]
                      if color_by_group else [("other examples", rest)])
            for name, part in splits:
                xs, ys, cd = _lines(part, text_of, labels)
                color = _rgba(colors.get(name, "#999999"), 0.35) if color_by_group else OTHER_COLOR
                fig.add_trace(_scatter_cls(len(xs))(
                    x=xs, y=ys, mode="lines", name=escape(name), customdata=cd, connectgaps=False,
                    line={"color": color, "width": 1}, hovertemplate=_LINE_HOVER,
                    legendgroup=escape(name)))
        order = [("top", highlight_top), ("bottom", highlight_bottom), ("selected", selected)]
        for role, members in order:
            for eid in dict.fromkeys(int(i) for i in members):
                if roles.get(eid) != role:
                    continue
                part = traj[traj["example_id"].astype(int) == eid]
                xs, ys, cd = _lines(part, text_of, labels)
                grp = part["group"].iloc[0]
                color = colors.get(grp, ROLE_COLORS[role]) if color_by_group else ROLE_COLORS[role]
                fig.add_trace(go.Scatter(
                    x=xs[:-1], y=ys[:-1], customdata=cd[:-1], mode="lines+markers", name=f"{role} #{eid}",
                    line={"color": color, "width": 3 if role == "selected" else 2.5,
                          "dash": ROLE_DASH[role] if color_by_group else "solid"},
                    marker={"size": 6}, hovertemplate=_LINE_HOVER))
    fig = _layout(fig, title, "point", "GNQ", log_y=bool(log_y))
    _point_axis(fig, labels.index.tolist(), labels.tolist())
    return fig


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
        return empty_figure(title)
    gcol = traj["group"].map(group_name) if "group" in traj.columns else pd.Series(NO_GROUP, traj.index)
    frame = traj.assign(group=gcol, gnq=pd.to_numeric(traj["gnq"], errors="coerce"))
    frame = frame[np.isfinite(frame["gnq"].astype(float))]
    wanted = sorted(frame["group"].unique()) if groups is None else [group_name(g) for g in groups]
    frame = frame[frame["group"].isin(wanted)]
    if frame.empty:
        return empty_figure(title)
    if log_y is None:
        log_y = use_log(frame["gnq"])
    labels = _point_labels(frame)
    colors = dict(colors) if colors is not None else group_colors(gcol)
    text_of = _texts_for(traj, texts)
    fig = go.Figure()
    raw = len(frame) <= max_rows
    for g in wanted:
        part = frame[frame["group"] == g]
        if part.empty:
            continue
        common = {"name": escape(g), "marker": {"color": colors.get(g, OTHER_COLOR), "size": 4},
                  "line": {"width": 1.5}, "legendgroup": escape(g)}
        if raw:
            ids = part["example_id"].astype(int).to_numpy()
            fig.add_trace(go.Box(
                x=part["point"].astype(int), y=part["gnq"], boxpoints="outliers", customdata=ids[:, None],
                text=[f"#{i} {short_text(text_of.get(i))}" for i in ids], hoverinfo="y+text+name",
                hoveron="boxes+points", **common))
        else:
            stats = _box_stats(part)
            fig.add_trace(go.Box(x=stats.index.tolist(), q1=stats["q1"], median=stats["median"],
                                 q3=stats["q3"], lowerfence=stats["lo"], upperfence=stats["hi"],
                                 boxpoints=False, hoverinfo="y+name", **common))
    fig.update_layout(boxmode="group")
    fig = _layout(fig, title, "point", "GNQ", log_y=bool(log_y))
    _point_axis(fig, labels.index.tolist(), labels.tolist())
    if not raw:
        fig.add_annotation(text=f"box statistics from {len(frame):,} rows; individual outliers not drawn",
                           xref="paper", yref="paper", x=1, y=1.06, showarrow=False, xanchor="right",
                           font={"size": 11, "color": "#666"})
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


def example_trajectory(traj_one: pd.DataFrame, *, text: str | None = None,
                       log_y: bool | None = None) -> go.Figure:
    """One example's GNQ across the run (left axis) with its loss on a secondary axis.

    customdata: [example id, text, point label, step]."""
    title = "GNQ and loss across the run"
    if traj_one.empty or not {"point", "gnq"} <= set(traj_one.columns):
        return empty_figure(title)
    one = traj_one.sort_values("point")
    eid = int(one["example_id"].iloc[0]) if "example_id" in one.columns else None
    if eid is not None:
        title = f"Example #{eid}: GNQ and loss across the run"
    shown = short_text(text if text is not None else (one["text"].iloc[0] if "text" in one.columns else None))
    labels = _point_labels(one)
    points = one["point"].astype(int).tolist()
    steps = one["step"].tolist() if "step" in one.columns else [None] * len(one)
    custom = [[eid, shown, escape(labels.get(p, p)), _fmt(s, ".0f")]
              for p, s in zip(points, steps, strict=True)]
    gnq = pd.to_numeric(one["gnq"], errors="coerce")
    if log_y is None:
        log_y = use_log(gnq)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=points, y=gnq, mode="lines+markers", name="GNQ", customdata=custom,
                             line={"color": ROLE_COLORS["top"], "width": 2.5},
                             hovertemplate=("#%{customdata[0]} %{customdata[1]}<br>%{customdata[2]} "
                                            "(step %{customdata[3]}): GNQ %{y:.4g}<extra></extra>")),
                  secondary_y=False)
    if "loss" in one.columns and pd.to_numeric(one["loss"], errors="coerce").notna().any():
        loss = pd.to_numeric(one["loss"], errors="coerce")
        fig.add_trace(go.Scatter(x=points, y=loss, mode="lines+markers", name="loss", customdata=custom,
                                 line={"color": "#7F7F7F", "width": 1.5, "dash": "dot"},
                                 hovertemplate=("#%{customdata[0]} %{customdata[2]} (step %{customdata[3]}): "
                                                "loss %{y:.4g}<extra></extra>")),
                      secondary_y=True)
        fig.update_yaxes(title_text="loss", type="log" if use_log(loss) else "linear", secondary_y=True,
                         showgrid=False)
    fig.update_layout(template=TEMPLATE, title=title, hovermode="closest")
    fig.update_xaxes(title_text="point")
    fig.update_yaxes(title_text="GNQ", type="log" if log_y else "linear", secondary_y=False)
    _point_axis(fig, labels.index.tolist(), labels.tolist())
    return fig


# --------------------------------------------------------------------------- extraction
def extraction_vs_quantile(bins_frame: pd.DataFrame, *, texts: Mapping[int, str] | None = None,
                           score_label: str = "GNQ_total", log_y2: bool | None = None) -> go.Figure:
    """Extraction success rate per score quantile bin (bars, %, left) and the bin's mean score
    (line, right, log when it spans decades) — paper Fig. 6.  Input: ``analysis.quantile_bins``.

    customdata: [id of the bin's highest-scoring example (when the frame has example_ids),
    its text, n, lo, hi, mean match]."""
    title = f"Extraction success by {score_label} quantile"
    need = {"bin", "success_rate", "mean_score"}
    if bins_frame is None or bins_frame.empty or not need <= set(bins_frame.columns):
        return empty_figure(title)
    b = bins_frame.sort_values("bin")
    text_of = {int(k): v for k, v in texts.items()} if texts is not None else {}
    custom = []
    for r in b.to_dict("records"):
        ids = r.get("example_ids")
        best = int(ids[-1]) if isinstance(ids, list | tuple | np.ndarray) and len(ids) else None
        custom.append([best, short_text(text_of.get(best)) if best is not None else "", int(r.get("n", 0)),
                       _fmt(r.get("lo")), _fmt(r.get("hi")), _fmt(r.get("mean_match"), ".2f")])
    if log_y2 is None:
        log_y2 = use_log(b["mean_score"])
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=b["bin"], y=100 * b["success_rate"].astype(float), name="extraction success",
                         customdata=custom, marker={"color": GROUP_PALETTE[0]},
                         hovertemplate=(f"bin %{{x}}: %{{customdata[2]}} examples, {escape(score_label)} "
                                        "%{customdata[3]} – %{customdata[4]}<br>success %{y:.1f}% · "
                                        "mean match %{customdata[5]}<br>highest: #%{customdata[0]} "
                                        "%{customdata[1]}<extra></extra>")),
                  secondary_y=False)
    fig.add_trace(go.Scatter(x=b["bin"], y=b["mean_score"], mode="lines+markers",
                             name=f"mean {escape(score_label)}", customdata=custom,
                             line={"color": GROUP_PALETTE[1], "width": 2.5},
                             hovertemplate=(f"bin %{{x}}: mean {escape(score_label)} %{{y:.4g}}"
                                            "<extra></extra>")),
                  secondary_y=True)
    fig.update_layout(template=TEMPLATE, title=title, hovermode="closest", bargap=0.15)
    fig.update_xaxes(title_text=f"{escape(score_label)} quantile bin (1 = lowest)", tickmode="linear",
                     dtick=1)
    fig.update_yaxes(title_text="extraction success (%)", range=[0, 105], secondary_y=False)
    fig.update_yaxes(title_text=f"mean {escape(score_label)}", type="log" if log_y2 else "linear",
                     secondary_y=True, showgrid=False)
    return fig


# --------------------------------------------------------------------------- §4: 2D regression
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
        return empty_figure(title)
    n = xs.size
    gnq = _as_array(gnq_values) if gnq_values is not None else np.full(n, np.nan)
    if gnq.size != n:
        raise ValueError(f"regression_data: {n} points but {gnq.size} GNQ values")
    fit = w * xs + b
    log_c = use_log(gnq)
    colour = np.log10(gnq) if log_c else gnq
    finite = np.isfinite(colour)
    if finite.any() and np.ptp(colour[finite]) > 0:
        size = 10 + 20 * (colour - np.nanmin(colour[finite])) / np.ptp(colour[finite])
    else:
        size = np.full(n, 16.0)
    size = np.where(np.isfinite(size), size, 10.0)
    names = [_point_name(j, label_offset) for j in range(n)]
    custom = [[j, names[j], _fmt(gnq[j]), _fmt(ys[j] - fit[j])] for j in range(n)]
    lo, hi = float(xs.min()), float(xs.max())
    pad = 0.1 * (hi - lo) if hi > lo else 1.0
    line_x = np.array([lo - pad, hi + pad])
    fig = go.Figure()
    res_x = [v for j in range(n) for v in (xs[j], xs[j], None)]
    res_y = [v for j in range(n) for v in (ys[j], fit[j], None)]
    fig.add_trace(go.Scatter(x=res_x, y=res_y, mode="lines", name="residuals", hoverinfo="skip",
                             line={"color": "#BBBBBB", "width": 1, "dash": "dot"}))
    fig.add_trace(go.Scatter(x=line_x, y=w * line_x + b, mode="lines", name=f"y = {w:.3g}·x {b:+.3g}",
                             line={"color": "#444444", "width": 2}, hoverinfo="skip"))
    marker: dict[str, Any] = {"size": size, "line": {"width": 1, "color": "white"}}
    if finite.any():
        marker.update(color=np.where(finite, colour, np.nan), colorscale="Viridis", showscale=True,
                      colorbar={"title": {"text": "log10 GNQ" if log_c else "GNQ"}})
    else:
        marker.update(color=GROUP_PALETTE[0])
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
                                         "color": ROLE_COLORS["selected"], "line": {"width": 3}}))
    fig = _layout(fig, title, "x", "y")
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
        return empty_figure(title)
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
                                 line={"color": GROUP_PALETTE[0], "width": 3},
                                 hovertemplate=f"gᵀ S⁻¹ g = 1, S without {who}<extra></extra>"))
    seg_x = [v for j in range(n) for v in (0.0, g[j, 0], None)]
    seg_y = [v for j in range(n) for v in (0.0, g[j, 1], None)]
    fig.add_trace(go.Scatter(x=seg_x, y=seg_y, mode="lines", name="gradients", hoverinfo="skip",
                             line={"color": "#888888", "width": 1.5}, showlegend=False))
    custom = [[j, names[j], _fmt(g[j, 0]), _fmt(g[j, 1])] for j in range(n)]
    colors = [ROLE_COLORS["selected"] if j == sel else GROUP_PALETTE[1] for j in range(n)]
    fig.add_trace(go.Scatter(x=g[:, 0], y=g[:, 1], mode="markers+text", name="g_j",
                             text=[str(j + label_offset) for j in range(n)], textposition="top right",
                             customdata=custom, marker={"color": colors, "size": 10},
                             hovertemplate=("%{customdata[1]}: ∂ℓ/∂w %{customdata[2]}, ∂ℓ/∂b %{customdata[3]}"
                                            "<extra></extra>")))
    if n <= MAX_ARROWS:
        for j in range(n):
            if np.isfinite(g[j]).all():
                fig.add_annotation(x=g[j, 0], y=g[j, 1], ax=0, ay=0, xref="x", yref="y", axref="x", ayref="y",
                                   showarrow=True, arrowhead=2, arrowsize=1, arrowwidth=1.5, text="",
                                   arrowcolor=colors[j])
    fig = _layout(fig, title, "∂ℓ/∂w", "∂ℓ/∂b")
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
        return empty_figure(title)
    if gnq.size != loss.size:
        raise ValueError(f"ranking_comparison: {gnq.size} GNQ values but {loss.size} losses")
    n = gnq.size
    names = [_point_name(j, label_offset) for j in range(n)]
    by_gnq = np.lexsort((np.arange(n), np.where(np.isfinite(gnq), -gnq, np.inf)))
    by_loss = np.lexsort((np.arange(n), np.where(np.isfinite(loss), loss, np.inf)))
    rank_gnq, rank_loss = np.empty(n, int), np.empty(n, int)
    rank_gnq[by_gnq], rank_loss[by_loss] = np.arange(1, n + 1), np.arange(1, n + 1)
    custom = np.array([[j, names[j], int(rank_gnq[j]), int(rank_loss[j]), _fmt(gnq[j]), _fmt(loss[j])]
                       for j in range(n)], dtype=object)
    colors = [GROUP_PALETTE[j % len(GROUP_PALETTE)] for j in range(n)]
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
    fig.update_xaxes(title_text="GNQ", type="log" if use_log(gnq) else "linear", row=1, col=1)
    fig.update_xaxes(title_text="loss", type="log" if use_log(loss) else "linear", row=1, col=2)
    fig.update_yaxes(title_text="point", row=1, col=1)
    fig.update_layout(template=TEMPLATE, title=title, hovermode="closest", bargap=0.25)
    return fig


def run_comparison(pairs: pd.DataFrame, name_a: str, name_b: str, top: int) -> go.Figure:
    """GNQ_total of each text in run a (x) against run b (y), the diagonal y = x, texts in either
    run's top ``top`` ringed.  customdata: [example id in b, text, rank a, rank b]."""
    title = f"GNQ_total: {escape(name_a)} vs. {escape(name_b)}"
    if pairs.empty:
        return empty_figure(title)
    groups = pairs["group"].map(group_name)
    colors = group_colors(groups)
    fig = go.Figure()
    lo = float(min(pairs["gnq_a"].min(), pairs["gnq_b"].min()))
    hi = float(max(pairs["gnq_a"].max(), pairs["gnq_b"].max()))
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="same GNQ in both", hoverinfo="skip",
                             line={"color": "#888888", "width": 1, "dash": "dot"}))
    for g in sorted(groups.unique()):
        part = pairs[groups == g]
        top_either = (part["rank_a"] <= top) | (part["rank_b"] <= top)
        custom = [[int(r.example_id_b), short_text(r.text), int(r.rank_a), int(r.rank_b)]
                  for r in part.itertuples(index=False)]
        fig.add_trace(_scatter_cls(len(part))(
            x=part["gnq_a"], y=part["gnq_b"], mode="markers", name=escape(g), customdata=custom,
            marker={"color": colors.get(g, OTHER_COLOR), "size": np.where(top_either, 10, 6),
                    "line": {"width": np.where(top_either, 1.5, 0), "color": "#222222"}},
            hovertemplate="#%{customdata[0]} %{customdata[1]}<br>rank %{customdata[2]} → %{customdata[3]}"
                          "<extra></extra>"))
    log = use_log(pd.concat([pairs["gnq_a"], pairs["gnq_b"]]))
    return _layout(fig, title, f"GNQ_total in {escape(name_a)}", f"GNQ_total in {escape(name_b)}",
                   log_x=log, log_y=log)
