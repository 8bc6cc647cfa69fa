"""Dashboard charts: each builder on small frames — traces, axis types, customdata ids, escaped text."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import pytest
import streamlit  # noqa: F401 (registers its plotly template as the default, as in the dashboard)

from gnq_core.analysis.summaries import quantile_bins
from gnq_core.dashboard import charts
from gnq_core.dashboard.charts import base

EVIL = "<script>alert('x')</script> & <b>bold</b> " + "long " * 40


def totals_frame(n: int = 40, spread: bool = True) -> pd.DataFrame:
    ids = np.arange(n)
    gnq = 10 ** (ids / 8) if spread else 1.0 + ids / n
    return pd.DataFrame({
        "example_id": ids, "text": [EVIL if i == n - 1 else f"text {i}" for i in ids],
        "group": np.where(ids % 2 == 0, "false", "true"), "n_tokens": 20, "gnq_total": gnq,
        "loss_last": 3.0 - ids / n, "self_influence_last": gnq, "rank": n - ids,
        "extraction_match": np.where(ids > n * 0.8, 1.0, 0.2)})


def traj_frame(n: int = 6, points: int = 4) -> pd.DataFrame:
    rows = []
    for eid in range(n):
        for p in range(points):
            rows.append({"example_id": eid, "point": p, "label": f"epoch-{p + 1}", "step": 10 * p,
                         "gnq": 10.0 ** (eid * 0.5 + p * 0.3), "loss": 3.0 - 0.5 * p,
                         "self_influence": 1.0, "group": "<i>false</i>" if eid % 2 else "true"})
    return pd.DataFrame(rows)


def is_figure(fig) -> None:
    assert isinstance(fig, go.Figure)
    fig.to_json()  # serialisable


def assert_escaped(fig: go.Figure) -> None:
    """No raw tag from user data reaches the figure (plotly's JSON would write < as \\u003c)."""
    text = fig.to_json()
    for raw in ("<script>", "\\u003cscript", "<b>bold", "\\u003cb\\u003ebold", "<i>false", "\\u003ci\\u003e"):
        assert raw not in text, raw


def ids_in(trace) -> set[int]:
    return {int(row[0]) for row in trace.customdata if row is not None and row[0] is not None}


def no_data(fig: go.Figure) -> bool:
    return any("no data" in (a.text or "") or "no positive" in (a.text or "") for a in fig.layout.annotations)


# --------------------------------------------------------------------------- helpers
def test_helpers():
    assert base.use_log([1, 10, 1000]) and not base.use_log([1, 10, 50])
    assert not base.use_log([0, 1, 1e6]) and not base.use_log([]) and not base.use_log([np.nan, 5])
    s = base.short_text(EVIL)
    assert "<" not in s and "&lt;script&gt;" in s
    assert len(base.short_text("x" * 200)) == base.TEXT_LIMIT and base.short_text("a\n  b") == "a b"
    assert base.short_text(None) == "" and base.short_text(np.nan) == ""
    assert base.group_colors(["b", "a", None]) == base.group_colors(["a", None, "b", "a"])
    assert set(base.group_colors(["b", "a", None])) == {"a", "b", base.NO_GROUP}


# --------------------------------------------------------------------------- overview
def test_histogram_log_and_linear():
    t = totals_frame()
    fig = charts.gnq_histogram(t)
    is_figure(fig)
    assert fig.layout.xaxis.title.text == "GNQ_total (log10)"
    assert fig.layout.paper_bgcolor is None and fig.layout.plot_bgcolor is None  # the theme's
    bar = fig.data[0]
    assert bar.type == "bar" and sum(bar.y) == len(t)
    assert ids_in(bar) <= set(t["example_id"]) and t["example_id"].max() in ids_in(bar)
    assert_escaped(fig)
    lin = charts.gnq_histogram(totals_frame(spread=False))
    assert lin.layout.xaxis.title.text == "GNQ_total"
    forced = charts.gnq_histogram(t, log_x=False)
    assert forced.layout.xaxis.title.text == "GNQ_total"


def test_histogram_empty():
    for frame in (pd.DataFrame(), totals_frame().assign(gnq_total=np.nan)):
        fig = charts.gnq_histogram(frame)
        is_figure(fig)
        assert no_data(fig)
    fig = charts.gnq_histogram(totals_frame().assign(gnq_total=-1.0), log_x=True)
    assert no_data(fig)


def test_gnq_vs_loss():
    t = totals_frame()
    fig = charts.gnq_vs_loss(t)
    is_figure(fig)
    assert {tr.name for tr in fig.data} == {"false", "true"}
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "linear"
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text
    assert set().union(*(ids_in(tr) for tr in fig.data)) == set(t["example_id"])
    colors = base.group_colors(t["group"])
    assert {tr.marker.color for tr in fig.data} == set(colors.values())
    assert_escaped(fig)


def test_gnq_vs_loss_samples_deterministically_keeping_the_top():
    t = totals_frame(300)
    fig = charts.gnq_vs_loss(t, max_points=60, seed=3, keep_top=50)
    shown = set().union(*(ids_in(tr) for tr in fig.data))
    assert len(shown) == 60 and set(range(250, 300)) <= shown
    again = set().union(*(ids_in(tr) for tr in charts.gnq_vs_loss(t, max_points=60, seed=3).data))
    assert shown == again
    assert any("showing 60 of 300" in a.text for a in fig.layout.annotations)


def test_gnq_vs_loss_empty():
    assert no_data(charts.gnq_vs_loss(pd.DataFrame()))
    assert no_data(charts.gnq_vs_loss(totals_frame().assign(loss_last=None)))


# --------------------------------------------------------------------------- trajectories
def test_trajectories_roles_and_axes():
    traj = traj_frame()
    texts = {i: EVIL for i in range(6)}
    fig = charts.trajectories(traj, [5], [0], [2], False, texts=texts)
    is_figure(fig)
    names = [tr.name for tr in fig.data]
    assert names == ["other examples", "top #5", "bottom #0", "selected #2"]
    assert fig.layout.yaxis.type == "log"
    assert list(fig.layout.xaxis.ticktext) == ["epoch-1", "epoch-2", "epoch-3", "epoch-4"]
    assert ids_in(fig.data[0]) == {1, 3, 4}
    assert ids_in(fig.data[1]) == {5}
    assert fig.data[1].line.color == base.ROLE_COLORS["top"]
    assert fig.data[0].line.color == base.OTHER_COLOR
    assert_escaped(fig)


def test_trajectories_by_group_with_band():
    traj = traj_frame()
    band = (traj.groupby(["point", "label"])["gnq"].quantile([0.1, 0.5, 0.9]).unstack()
            .rename(columns={0.1: "q10", 0.5: "q50", 0.9: "q90"}).reset_index())
    fig = charts.trajectories(traj, [5], [], [], True, band=band)
    is_figure(fig)
    names = [tr.name for tr in fig.data]
    assert "median" in names and "10–90 % of examples" in names
    assert "&lt;i&gt;false&lt;/i&gt;" in names and "true" in names
    assert any(tr.fill == "tonexty" for tr in fig.data)
    assert_escaped(fig)
    only_band = charts.trajectories(traj.iloc[0:0], [], [], [], False, band=band)
    assert len(only_band.data) == 3 and not no_data(only_band)


def test_trajectories_linear_when_narrow_and_empty():
    traj = traj_frame(2, 3).assign(gnq=lambda f: 1.0 + f["point"])
    assert charts.trajectories(traj, [], [], [], False).layout.yaxis.type == "linear"
    assert no_data(charts.trajectories(pd.DataFrame(), [], [], [], False))


def test_group_distributions():
    traj = traj_frame(8)
    fig = charts.group_distributions(traj, texts={i: EVIL for i in range(8)})
    is_figure(fig)
    assert [tr.type for tr in fig.data] == ["box", "box"]
    assert fig.layout.boxmode == "group" and fig.layout.yaxis.type == "log"
    assert set().union(*(ids_in(tr) for tr in fig.data)) == set(range(8))
    assert_escaped(fig)
    one = charts.group_distributions(traj, groups=["true"])
    assert [tr.name for tr in one.data] == ["true"]
    big = charts.group_distributions(traj, max_rows=5)             # precomputed statistics
    assert big.data[0].q1 is not None and big.data[0].y is None
    assert no_data(charts.group_distributions(pd.DataFrame()))
    assert no_data(charts.group_distributions(traj, groups=["nobody"]))


def test_example_trajectory():
    one = traj_frame().query("example_id == 5")
    fig = charts.example_trajectory(one, text=EVIL)
    is_figure(fig)
    assert [tr.name for tr in fig.data] == ["GNQ", "loss"]
    assert fig.data[1].yaxis == "y2"
    assert fig.layout.yaxis.title.text == "GNQ" and fig.layout.yaxis2.title.text == "loss"
    assert ids_in(fig.data[0]) == {5}
    assert_escaped(fig)
    assert no_data(charts.example_trajectory(one.iloc[0:0]))
    # GNQ over three decades (the demo's drill-down): a log axis labelled at powers of ten alone
    wide = one.assign(gnq=[10.0 ** (3 * i / max(len(one) - 1, 1)) for i in range(len(one))])
    log = charts.example_trajectory(wide)
    assert log.layout.yaxis.type == "log" and log.layout.yaxis.dtick == 1


# --------------------------------------------------------------------------- extraction
def test_extraction_vs_quantile():
    t = totals_frame()
    bins = quantile_bins(t, bins=5)
    fig = charts.extraction_vs_quantile(bins, texts=dict(zip(t["example_id"], t["text"], strict=True)))
    is_figure(fig)
    bar, line = fig.data
    assert bar.type == "bar" and line.type == "scatter" and line.yaxis == "y2"
    assert list(bar.y) == pytest.approx([0, 0, 0, 0, 100 * 7 / 8])
    assert fig.layout.yaxis2.type == "log" and fig.layout.yaxis.range == (0, 105)
    assert ids_in(bar) == {7, 15, 23, 31, 39}              # each bin's highest-GNQ example
    assert_escaped(fig)
    assert no_data(charts.extraction_vs_quantile(quantile_bins(pd.DataFrame())))


# --------------------------------------------------------------------------- §4 regression
X = np.array([-2.0, -1.2, -0.5, 0.4, 1.1, 1.9, 0.3])
Y = np.array([-2.9, -1.5, 0.1, 1.7, 3.3, 4.7, 4.6])
W, B = 1.5, 0.5


def regression_inputs():
    r = Y - (W * X + B)
    G = -r[:, None] * np.stack([X, np.ones_like(X)], axis=1)
    gnq = np.array([0.05, 0.1, 0.2, 0.1, 0.05, 0.3, 80.0])
    t = np.linspace(0, 2 * np.pi, 50)
    circle = np.stack([np.cos(t), np.sin(t)], axis=1)
    return G, gnq, circle


def test_regression_data():
    _, gnq, _ = regression_inputs()
    fig = charts.regression_data(X, Y, W, B, 6, gnq)
    is_figure(fig)
    names = [tr.name for tr in fig.data]
    assert "data" in names and any(n.startswith("y = ") for n in names) and "selected: point 7" in names
    data = fig.data[names.index("data")]
    assert [row[0] for row in data.customdata] == list(range(7))
    assert data.marker.size[6] == max(data.marker.size)            # largest GNQ → largest marker
    assert fig.layout.xaxis.title.text == "x"
    is_figure(charts.regression_data(X, Y, W, B, None, None))
    assert no_data(charts.regression_data([], [], W, B, None, []))


def test_gradient_space():
    G, _, circle = regression_inputs()
    fig = charts.gradient_space(G, 6, circle * 3, {0: circle, 1: circle * 2}, strip_halfwidth=0.5)
    is_figure(fig)
    names = [tr.name for tr in fig.data]
    strip = fig.data[0]
    assert strip.fill == "toself" and set(strip.y) == {-0.5, 0.5}
    assert "ellipse of S without point 7" in names
    assert sum(tr.name == "ellipses leaving out other points" for tr in fig.data) == 2
    assert sum(bool(tr.showlegend) for tr in fig.data if tr.name == "ellipses leaving out other points") == 1
    points = fig.data[names.index("g_j")]
    assert [row[0] for row in points.customdata] == list(range(7))
    assert fig.layout.yaxis.scaleanchor == "x" and fig.layout.yaxis.scaleratio == 1
    assert len(fig.layout.annotations) == 7                         # arrows
    bare = charts.gradient_space(G, None, None, None, None)
    assert "ellipse" not in " ".join(tr.name for tr in bare.data)
    assert no_data(charts.gradient_space(np.empty((0, 2)), None, None))


def test_ranking_comparison():
    _, gnq, _ = regression_inputs()
    loss = 0.5 * (Y - (W * X + B)) ** 2
    fig = charts.ranking_comparison(gnq, loss)
    is_figure(fig)
    left, right = fig.data
    assert left.orientation == "h" and right.xaxis == "x2"
    assert left.y[0] == "point 7"                                    # highest GNQ first
    assert right.y[0] == f"point {int(np.argmin(loss)) + 1}"         # lowest loss first
    assert sorted(row[0] for row in left.customdata) == list(range(7))
    assert fig.layout.xaxis.type == "log" and fig.layout.xaxis2.type in ("linear", "log")
    row = next(r for r in left.customdata if r[0] == 6)
    assert row[2] == 1
    assert no_data(charts.ranking_comparison([], []))
    with pytest.raises(ValueError):
        charts.ranking_comparison([1, 2], [1])


def membership_roc() -> go.Figure:
    """The membership log-ROC of an evidence table (members vs non-members)."""
    from gnq_core.analysis import evidence as ev
    from gnq_core.analysis.predictive import roc_points
    from gnq_core.analysis.predictive_figures import roc_figure

    rng = np.random.default_rng(0)
    member = np.arange(400) % 2 == 0
    frame = pd.DataFrame({"example_id": range(400), "member": member, "n_tokens": 20,
                          "loss_last": rng.normal(size=400) - member})
    table = ev.evidence_table(frame, resamples=20, cv=False)
    rows = table[table["scope"] == ev.SCOPE_ALL]
    return roc_figure(roc_points(frame, outcome="member"), rows, log_fpr=True, template=None,
                      positive="member", negative="non-member")


def test_membership_roc_reads_the_low_fpr_region_on_a_log_axis():
    fig = membership_roc()
    assert fig.layout.xaxis.type == "log" and "non-member" in fig.layout.xaxis.title.text
    names = [t.name for t in fig.data]
    assert names[0].startswith("loss (AUC ") and names[-1] == "chance"


def every_figure() -> list[go.Figure]:
    from gnq_core.analysis.predictive import evaluate, roc_points
    from gnq_core.analysis.predictive_figures import roc_figure

    t, traj = totals_frame(), traj_frame()
    G, gnq, circle = regression_inputs()
    pairs = pd.DataFrame({"example_id_b": range(6), "gnq_a": [1.0, 2, 3, 4, 5, 6],
                          "gnq_b": [2.0, 1, 3, 6, 5, 4],
                          "rank_a": [6, 5, 4, 3, 2, 1], "rank_b": [5, 6, 4, 1, 2, 3], "group": ["a", "b"] * 3,
                          "text": [f"t{i}" for i in range(6)]})
    signals = pd.DataFrame({"example_id": range(40), "extracted": [i % 3 == 0 for i in range(40)],
                            "gnq_total": np.linspace(1, 5, 40), "loss_last": np.linspace(3, 1, 40),
                            "n_tokens": [20] * 40})
    roc = roc_figure(roc_points(signals), evaluate(signals, resamples=20), template=None)
    return [membership_roc(), charts.gnq_histogram(t), charts.gnq_vs_loss(t),
            charts.trajectories(traj, [1], [0], [], True),
            charts.group_distributions(traj), charts.example_trajectory(traj[traj.example_id == 1]),
            charts.extraction_vs_quantile(quantile_bins(t)), charts.regression_data(X, Y, W, B, 0, gnq),
            charts.gradient_space(G, 0, circle, {2: circle}, 1.0), charts.ranking_comparison(gnq, gnq),
            charts.run_comparison(pairs, "a", "b", 2), base.empty_figure("nothing"), roc]


def test_all_builders_json_roundtrip():
    """Every figure survives to_json (what st.plotly_chart sends) and parses back."""
    for fig in every_figure():
        assert json.loads(fig.to_json())["layout"]["template"]


# --------------------------------------------------------------------------- light and dark
CONFIG = Path(__file__).resolve().parents[2] / "gnq_core" / "dashboard" / ".streamlit" / "config.toml"
THEMES = tomllib.loads(CONFIG.read_text())
NAMED = {"white": (255, 255, 255), "black": (0, 0, 0), "grey": (128, 128, 128), "gray": (128, 128, 128)}


def rgb_alpha(color: str) -> tuple[tuple[float, float, float], float]:
    color = color.strip().lower()
    if color in NAMED:
        return NAMED[color], 1.0
    if color.startswith("#") and len(color) in (4, 7):
        digits = color[1:] if len(color) == 7 else "".join(c * 2 for c in color[1:])
        return tuple(int(digits[i:i + 2], 16) for i in (0, 2, 4)), 1.0
    m = re.fullmatch(r"rgba?\(([^)]*)\)", color)
    assert m, f"a colour the check cannot read: {color!r}"
    parts = [float(v) for v in m.group(1).split(",")]
    return tuple(parts[:3]), parts[3] if len(parts) > 3 else 1.0


def contrast(a: str, b: str) -> float:
    """WCAG 2 contrast ratio of two opaque colours."""
    def lum(color: str) -> float:
        channels = [c / 255 for c in rgb_alpha(color)[0]]
        r, g, b_ = (c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
        return 0.2126 * r + 0.7152 * g + 0.0722 * b_
    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def colours_in(node, path: str = "") -> list[tuple[str, str]]:
    """(where, colour) for every colour a figure sets itself (its template excluded)."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "template":
                continue
            where = f"{path}.{key}"
            if "color" in key and key not in ("colorscale", "colorbar", "coloraxis", "autocolorscale"):
                values = value if isinstance(value, list | tuple) else [value]
                found += [(where, v) for v in values if isinstance(v, str)]
            else:
                found += colours_in(value, where)
    elif isinstance(node, list | tuple):
        for i, value in enumerate(node):
            found += colours_in(value, f"{path}[{i}]")
    return found


def test_the_themes_are_readable_in_light_and_dark():
    theme = THEMES["theme"]
    for mode in ("light", "dark"):
        colours = {**theme, **theme[mode]}
        assert contrast(colours["textColor"], colours["backgroundColor"]) >= 7, mode
        assert contrast(colours["textColor"], colours["secondaryBackgroundColor"]) >= 7, mode
        assert contrast(colours["primaryColor"], colours["backgroundColor"]) >= 3, mode
    assert "base" not in theme  # a fixed base would keep the viewer from the other one


def test_no_chart_sets_a_background_or_a_colour_that_vanishes_in_one_theme():
    """Figures take the dashboard's template (Streamlit's: its colours follow the viewer's light
    or dark theme); every opaque colour they set themselves stays visible on both backgrounds."""
    backgrounds = [THEMES["theme"][mode]["backgroundColor"] for mode in ("light", "dark")]
    assert pio.templates.default == "streamlit"
    for fig in every_figure():
        spec = fig.to_plotly_json()
        title = fig.layout.title.text
        assert fig.layout.template == pio.templates[pio.templates.default], title
        layout = spec["layout"]
        assert not {"paper_bgcolor", "plot_bgcolor"} & set(layout), title
        for where, colour in colours_in(spec):
            if rgb_alpha(colour)[1] < 0.5:
                continue  # translucent: a band or a crowd of points, blended with either background
            for bg in backgrounds:
                assert contrast(colour, bg) >= 2.0, f"{title}: {where} = {colour} on {bg}"
        assert title and base.describe(fig).startswith(re.sub("<[^>]+>", " ", title).strip()[:10])
        for name in (k for k in layout if re.fullmatch(r"[xy]axis\d*", k)):
            axis = fig.layout[name]
            assert axis.visible is False or axis.title.text, f"{title}: {name} has no title"


def test_a_reference_line_is_described_as_a_line_not_as_points():
    import plotly.graph_objects as go

    fig = go.Figure([go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="same GNQ in both"),
                     go.Scatter(x=[0.2, 0.5, 0.7], y=[0.1, 0.4, 0.9], mode="markers", name="world")])
    fig.update_layout(title="GNQ_total", xaxis_title="a", yaxis_title="b")
    text = base.describe(fig)
    assert "same GNQ in both (a line)" in text and "world (3 points)" in text


def test_a_lone_ungrouped_series_is_not_named_and_log_ticks_show_whole_values():
    """No caption "series: (none)"; a log axis labels its powers of ten as whole values (10, 100,
    1000), never Plotly's small "2" and "5" between them, which read as "2 1000 5" down the axis."""
    points = go.Scatter(x=[1, 10, 1000], y=[1, 2, 3], mode="markers", name=base.NO_GROUP)
    fig = base.layout(go.Figure([points]), "GNQ", "GNQ_total", "loss", log_x=True)
    assert "series" not in base.describe(fig) and "(none)" not in base.describe(fig)
    assert fig.layout.xaxis.tickformat == "~g" and fig.layout.yaxis.tickformat is None
    assert fig.layout.xaxis.dtick == 1 and fig.layout.yaxis.dtick is None
