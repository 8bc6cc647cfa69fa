"""GNQ Audit dashboard: navigation only; each page lives in app/pages/."""

from __future__ import annotations

import streamlit as st

from app import state

st.set_page_config(page_title="GNQ Audit", page_icon="🔎", layout="wide")

PAGES = [
    st.Page("pages/runs.py", title="Runs", icon="🗂️", default=True),
    st.Page("pages/new_audit.py", title="New audit", icon="➕"),
    st.Page("pages/trajectories.py", title="Trajectories", icon="📈"),
    st.Page("pages/extraction.py", title="Extraction vs GNQ", icon="🎯"),
    st.Page("pages/groups.py", title="Groups", icon="🧩"),
    st.Page("pages/drilldown.py", title="Text drill-down", icon="🔍"),
    st.Page("pages/flagged.py", title="Flagged texts", icon="🚩"),
    st.Page("pages/regression.py", title="GNQ explained: 2D regression", icon="📐"),
]
state.PAGES.update({p.title: p for p in PAGES})
st.navigation(PAGES).run()
