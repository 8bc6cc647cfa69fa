"""Charts on a page: drawn in the viewer's theme, each with a text alternative below it."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import streamlit as st

from app.charts import describe
from app.state import plain


def chart(fig: go.Figure, where: Any = None, note: str = "", **kwargs: Any) -> Any:
    """``st.plotly_chart`` with ``theme="streamlit"`` (light or dark, as the viewer's app is), then a
    caption in words: the figure's title, axes and series (``charts.describe``) and ``note``
    (Markdown, user data escaped by the caller).
    ``where``: a column or container to draw in; ``kwargs`` go to st.plotly_chart."""
    where = where if where is not None else st
    event = where.plotly_chart(fig, theme="streamlit", **kwargs)
    where.caption(" ".join(p for p in (plain(describe(fig)), note) if p))
    return event
