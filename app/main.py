"""GNQ Audit dashboard: navigation only; each page lives in app/views/.

(Not app/pages/: Streamlit auto-routes a folder of that name and deep links would skip this file.)
"""

from __future__ import annotations

import streamlit as st

from app import state
from gnq_core import one_line
from gnq_core.access import token_ok
from gnq_core.results import StoreError

st.set_page_config(page_title="GNQ Audit", page_icon=":material/policy:", layout="wide")

# Served remotely (`gnq dashboard --address 0.0.0.0`), the dashboard asks for the token it printed.
if not st.session_state.get("authorised"):
    if not token_ok(st.query_params.get("token")):
        st.error("This dashboard needs its access token: open the address `gnq dashboard` printed "
                 "(it ends in ?token=…).")
        st.stop()
    st.session_state["authorised"] = True

PAGES = [
    st.Page("views/runs.py", title="Runs", icon=":material/table_rows:", default=True),
    st.Page("views/new_audit.py", title="New audit", icon=":material/add_circle:"),
    st.Page("views/trajectories.py", title="Trajectories", icon=":material/show_chart:"),
    st.Page("views/extraction.py", title="Extraction vs GNQ", icon=":material/target:"),
    st.Page("views/groups.py", title="Groups", icon=":material/category:"),
    st.Page("views/drilldown.py", title="Text drill-down", icon=":material/search:"),
    st.Page("views/flagged.py", title="Flagged texts", icon=":material/flag:"),
    st.Page("views/dataset_map.py", title="Dataset map", icon=":material/scatter_plot:"),
    st.Page("views/compare.py", title="Compare runs", icon=":material/compare_arrows:"),
    st.Page("views/regression.py", title="GNQ explained: 2D regression", icon=":material/function:"),
]
state.PAGES.update({p.title: p for p in PAGES})
try:
    st.navigation(PAGES).run()
except StoreError as exc:  # e.g. a job has held the store for too long: one line, no traceback
    st.error(one_line(exc))
