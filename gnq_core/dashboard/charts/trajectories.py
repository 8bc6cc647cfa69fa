"""GNQ along a run's points: all examples (paper Fig. 5) and one example's drill-down."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gnq_core.dashboard.charts import base


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

    ``part`` has example_id, point, gnq and group (already mapped by ``base.group_name``)."""
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
    short = {int(i): base.short_text(text_of.get(int(i))) for i in uniq}
    grp = part["group"].map(base.escape).to_numpy() if "group" in part.columns else np.full(m, base.NO_GROUP)
    lab = {int(p): base.escape(labels.get(p, p)) for p in np.unique(points)}
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
        return base.empty_figure(title)
    traj = traj if has_traj else pd.DataFrame(columns=["example_id", "point", "gnq", "group"])
    labels = base.point_labels(traj if has_traj else None, band if has_band else None)
    values = list(pd.to_numeric(traj["gnq"], errors="coerce"))
    if has_band:
        values += [v for c in ("q10", "q50", "q90") for v in pd.to_numeric(band[c], errors="coerce")]
    if log_y is None:
        log_y = base.use_log(values)
    fig = go.Figure()
    if has_band:
        b = band.sort_values("point")
        bx = b["point"].astype(int).tolist()
        band_cd = [[None, "", "", base.escape(labels.get(p, p))] for p in bx]
        fig.add_trace(go.Scatter(x=bx, y=b["q90"], mode="lines", line={"width": 0}, name="90th percentile",
                                 legendgroup="band", showlegend=False, customdata=band_cd,
                                 hovertemplate="%{customdata[3]}: 90th percentile %{y:.4g}<extra></extra>"))
        fig.add_trace(go.Scatter(x=bx, y=b["q10"], mode="lines", line={"width": 0}, fill="tonexty",
                                 fillcolor=base.BAND_COLOR, name="10–90 % of examples", legendgroup="band",
                                 customdata=band_cd,
                                 hovertemplate="%{customdata[3]}: 10th percentile %{y:.4g}<extra></extra>"))
        fig.add_trace(go.Scatter(x=bx, y=b["q50"], mode="lines", name="median",
                                 line={"color": base.GROUP_PALETTE[0], "width": 2, "dash": "dash"},
                                 legendgroup="band", customdata=band_cd,
                                 hovertemplate="%{customdata[3]}: median %{y:.4g}<extra></extra>"))
    if has_traj:
        text_of = base.texts_for(traj, texts)
        traj = traj.assign(group=base.groups_of(traj))
        colors = dict(colors) if colors is not None else base.group_colors(traj["group"])
        roles = _role_of(traj["example_id"].unique(), highlight_top, highlight_bottom, selected)
        rest = traj[~traj["example_id"].astype(int).isin(list(roles))]
        if not rest.empty:
            splits = ([(g, rest[rest["group"] == g]) for g in sorted(rest["group"].unique())]
                      if color_by_group else [("other examples", rest)])
            for name, part in splits:
                xs, ys, cd = _lines(part, text_of, labels)
                color = base.rgba(colors.get(name, "#999999"), 0.35) if color_by_group else base.OTHER_COLOR
                fig.add_trace(base.scatter_cls(len(xs))(
                    x=xs, y=ys, mode="lines", name=base.escape(name), customdata=cd, connectgaps=False,
                    line={"color": color, "width": 1}, hovertemplate=_LINE_HOVER,
                    legendgroup=base.escape(name)))
        order = [("top", highlight_top), ("bottom", highlight_bottom), ("selected", selected)]
        for role, members in order:
            for eid in dict.fromkeys(int(i) for i in members):
                if roles.get(eid) != role:
                    continue
                part = traj[traj["example_id"].astype(int) == eid]
                xs, ys, cd = _lines(part, text_of, labels)
                grp = part["group"].iloc[0]
                color = colors.get(grp, base.ROLE_COLORS[role]) if color_by_group else base.ROLE_COLORS[role]
                fig.add_trace(go.Scatter(
                    x=xs[:-1], y=ys[:-1], customdata=cd[:-1], mode="lines+markers", name=f"{role} #{eid}",
                    line={"color": color, "width": 3 if role == "selected" else 2.5,
                          "dash": base.ROLE_DASH[role] if color_by_group else "solid"},
                    marker={"size": 6}, hovertemplate=_LINE_HOVER))
    fig = base.layout(fig, title, "point", "GNQ", log_y=bool(log_y))
    base.point_axis(fig, labels.index.tolist(), labels.tolist())
    return fig


def example_trajectory(traj_one: pd.DataFrame, *, text: str | None = None,
                       log_y: bool | None = None) -> go.Figure:
    """One example's GNQ across the run (left axis) with its loss on a secondary axis.

    customdata: [example id, text, point label, step]."""
    title = "GNQ and loss across the run"
    if traj_one.empty or not {"point", "gnq"} <= set(traj_one.columns):
        return base.empty_figure(title)
    one = traj_one.sort_values("point")
    eid = int(one["example_id"].iloc[0]) if "example_id" in one.columns else None
    if eid is not None:
        title = f"Example #{eid}: GNQ and loss across the run"
    if text is None and "text" in one.columns:
        text = one["text"].iloc[0]
    shown = base.short_text(text)
    labels = base.point_labels(one)
    points = one["point"].astype(int).tolist()
    steps = one["step"].tolist() if "step" in one.columns else [None] * len(one)
    custom = [[eid, shown, base.escape(labels.get(p, p)), base.fmt(s, ".0f")]
              for p, s in zip(points, steps, strict=True)]
    gnq = pd.to_numeric(one["gnq"], errors="coerce")
    if log_y is None:
        log_y = base.use_log(gnq)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=points, y=gnq, mode="lines+markers", name="GNQ", customdata=custom,
                             line={"color": base.ROLE_COLORS["top"], "width": 2.5},
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
        log_loss = base.use_log(loss)
        fig.update_yaxes(title_text="loss", type="log" if log_loss else "linear", secondary_y=True,
                         showgrid=False, **base.LOG_TICKS if log_loss else {})
    fig.update_layout(title=title, hovermode="closest")
    fig.update_xaxes(title_text="point")
    fig.update_yaxes(title_text="GNQ", type="log" if log_y else "linear", secondary_y=False,
                     **base.LOG_TICKS if log_y else {})
    base.point_axis(fig, labels.index.tolist(), labels.tolist())
    return fig


def secret_tracking(rows: pd.DataFrame, names: Mapping[tuple[str, str], str] | None = None) -> go.Figure:
    """Each secret value's exposure at the steps it was probed while training (integrations/
    tracking.py), one line per value (its first text), a filled marker where it came out whole,
    the null's 99th percentile dotted.  ``names``: (kind, value) -> the line's label (a masked
    value; default its kind and text).  ``customdata[0]``: the text's example id."""
    measured = rows[rows["exposure"].notna()] if "exposure" in rows else rows.iloc[0:0]
    if measured.empty:
        return base.empty_figure("Secret values while training", "no exposure measured while training")
    fig = go.Figure()
    for (kind, value), part in measured.groupby(["kind", "value"], sort=False):
        first = part[part["example_id"] == part["example_id"].min()].sort_values("step")
        eid = int(first["example_id"].iloc[0])
        name = (names or {}).get((kind, value), f"{kind}, text {eid}")
        leaked = first["leaked"].astype(bool).to_numpy()
        fig.add_trace(go.Scatter(
            x=first["step"], y=first["exposure"].astype(float), mode="lines+markers", name=base.escape(name),
            marker={"symbol": np.where(leaked, "circle", "circle-open"), "size": np.where(leaked, 10, 6)},
            customdata=np.array([[eid, "yes" if x else "no"] for x in leaked], dtype=object),
            hovertemplate=f"{base.escape(name)}<br>step %{{x}}<br>exposure %{{y:.1f}} bits<br>"
                          "written whole: %{customdata[1]}<extra></extra>"))
    p99 = measured.groupby("step")["null_p99"].max().dropna()
    if len(p99):
        fig.add_trace(go.Scatter(x=p99.index, y=p99.to_numpy(dtype=float), mode="lines",
                                 line={"dash": "dot", "color": base.NEUTRAL},
                                 name="never-trained values, 99th percentile", hoverinfo="skip"))
    return base.layout(fig, "Secret values while training", "optimizer step", "exposure (bits)")
