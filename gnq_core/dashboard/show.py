"""Charts and tables on a page: charts drawn in the viewer's theme, each with a text alternative
below it; tables of texts that open a text's drill-down."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from gnq_core.analysis import RiskBasis, conversation_line, grouped, is_chat, texts_table_html
from gnq_core.dashboard.charts.base import describe
from gnq_core.dashboard.columns import column_config
from gnq_core.dashboard.state import open_example, plain


def chart(fig: go.Figure, where: Any = None, note: str = "", **kwargs: Any) -> Any:
    """``st.plotly_chart`` with ``theme="streamlit"`` (light or dark, as the viewer's app is), then a
    caption in words: the figure's title, axes and series (``charts.describe``) and ``note``
    (Markdown, user data escaped by the caller).
    ``where``: a column or container to draw in; ``kwargs`` go to st.plotly_chart."""
    where = where if where is not None else st
    event = where.plotly_chart(fig, theme="streamlit", **kwargs)
    where.caption(" ".join(p for p in (plain(describe(fig)), note) if p))
    return event


def texts(ranked: pd.DataFrame, *, limit: int | None = None, key: str = "") -> None:
    """The text-first table (analysis.findings): each text wrapped, its status tag (×N for
    copies, collapsed into one row), a one-line reason that expands, and what to do; then a
    picker that opens a text's drill-down."""
    st.html(texts_table_html(ranked, limit=limit))
    rows = grouped(ranked).head(limit) if limit else grouped(ranked)
    if key and len(rows):
        labels = {int(r.example_id): f"{r.example_id}: {conversation_line(str(r.text), r.turns, 90)}"
                  for r in rows.itertuples()}
        c1, c2 = st.columns([4, 1], vertical_alignment="bottom")
        picked = c1.selectbox("Open a text's drill-down", list(labels), format_func=labels.get, index=None,
                              key=key, placeholder="choose a text…")
        if c2.button("Open", key=f"{key}_open", disabled=picked is None):
            open_example(int(picked))


TOKENISED_HELP = ("The text as the model was trained on it: the chat template's tokens (role headers, "
                  "end-of-turn markers, a default system prompt) and all. Off: each turn as role: content.")
CONVERSATION_HELP = "Each turn as role: content (│ between turns); \"as tokenised\" shows the rendered text."


def layout_column(frame: pd.DataFrame) -> list[str]:
    """``["turns"]`` where ``frame`` has the texts' chat layouts (a table picked from it reads as
    turns with them), else none."""
    return ["turns"] if "turns" in frame.columns else []


def tokenised_toggle(frame: pd.DataFrame, key: str) -> bool:
    """For conversations: an "as tokenised" switch (off: the turns) and its value; plain texts: no
    switch, False (they look as they always did)."""
    return is_chat(frame) and st.toggle("as tokenised", key=key, help=TOKENISED_HELP)


def readable(frame: pd.DataFrame, tokenised: bool = False) -> pd.DataFrame:
    """``frame`` (a table of texts) with a conversation's ``text`` column read as turns, one line
    (a ``conversation`` column in its place); unchanged for plain texts or ``tokenised``."""
    if tokenised or "text" not in frame.columns or not is_chat(frame):
        return frame
    lines = [conversation_line(str(t), lay) for t, lay in zip(frame["text"], frame["turns"], strict=True)]
    at = list(frame.columns).index("text")
    out = frame.drop(columns=["text", *(["conversation"] if "conversation" in frame else [])])
    out.insert(min(at, len(out.columns)), "conversation", lines)
    return out


def table(frame: pd.DataFrame, key: str, config: dict | None = None) -> None:
    """A table of texts (an ``example_id`` column) whose selected row opens that text's drill-down;
    ``config``: its column_config (default: ``columns.column_config``). Streamlit's event is a dict."""
    config = column_config(frame) if config is None else config
    if "conversation" in frame.columns:
        config = {"conversation": st.column_config.Column("conversation", help=CONVERSATION_HELP), **config}
    # the layout's JSON is for the code, not for reading
    shown = frame.drop(columns=["turns"]) if "turns" in frame.columns else frame
    event = st.dataframe(shown, hide_index=True, width="stretch", on_select="rerun",
                         selection_mode="single-row", key=key, column_config=config)
    rows = [r for r in ((event or {}).get("selection") or {}).get("rows", []) if r < len(frame)]
    if rows:
        open_example(int(frame.iloc[rows[0]]["example_id"]))


def risk_basis(ranked: pd.DataFrame, warn: bool = True) -> None:
    """What the ``risk`` number is on this run (analysis.risk.RiskBasis), beside it: a warning when
    the ranking is loss-only and uncalibrated (no reference model, no ground truth) and ``warn``,
    else a caption."""
    if "risk" not in ranked.attrs:
        return
    basis = RiskBasis.from_dict(ranked.attrs["risk"])
    said = f"**Memorisation risk: {plain(basis.shown)}.** {plain(basis.sentence)}"
    (st.warning if basis.loss_only and warn else st.caption)(said)
