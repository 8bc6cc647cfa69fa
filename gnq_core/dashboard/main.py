"""GNQ Audit dashboard: navigation only; each page lives in views/, given by absolute path (the main
script may be app/main.py, which calls ``main``).  Not pages/: Streamlit auto-routes a folder of
that name and deep links would skip this file."""

from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from gnq_core import one_line
from gnq_core.access import COOKIE_NAME, GATE_ENV, TOKEN_ENV, cookie_ok, token_ok
from gnq_core.dashboard import state
from gnq_core.results import StoreError

VIEWS = Path(__file__).resolve().parent / "views"


def main() -> None:
    """Check the access token, then show the page the address names."""
    st.set_page_config(page_title="GNQ Audit", page_icon=":material/policy:", layout="wide")

    # Served remotely (`gnq dashboard --address 0.0.0.0`), the dashboard asks for the token it printed.
    # Its HTTP gate (gate.py) has already refused any request without it; this check is the second.
    if not st.session_state.get("authorised"):
        if os.environ.get(TOKEN_ENV) and not os.environ.get(GATE_ENV):
            st.error("This dashboard has a token but runs without its HTTP gate (uploads and downloads "
                     "would be open): start it with `gnq dashboard`.")
            st.stop()
        if not (token_ok(st.query_params.get("token")) or cookie_ok(st.context.cookies.get(COOKIE_NAME))):
            st.error("This dashboard needs its access token: open the address `gnq dashboard` printed "
                     "(it ends in ?token=…).")
            st.stop()
        st.session_state["authorised"] = True
    # The gate's cookie carries the session from here: the token leaves the address, so an address
    # copied to share a view never holds it.
    if "token" in st.query_params:
        del st.query_params["token"]

    pages = [
        st.Page(VIEWS / "runs.py", title="Runs", icon=":material/table_rows:", default=True),
        st.Page(VIEWS / "new_audit.py", title="New audit", icon=":material/add_circle:"),
        st.Page(VIEWS / "trajectories.py", title="Trajectories", icon=":material/show_chart:"),
        st.Page(VIEWS / "extraction.py", title="Extraction vs GNQ", icon=":material/target:"),
        st.Page(VIEWS / "groups.py", title="Groups", icon=":material/category:"),
        st.Page(VIEWS / "drilldown.py", title="Text drill-down", icon=":material/search:"),
        st.Page(VIEWS / "flagged.py", title="Flagged texts", icon=":material/flag:"),
        st.Page(VIEWS / "dataset_map.py", title="Dataset map", icon=":material/scatter_plot:"),
        st.Page(VIEWS / "compare.py", title="Compare runs", icon=":material/compare_arrows:"),
        st.Page(VIEWS / "regression.py", title="GNQ explained: 2D regression", icon=":material/function:"),
    ]
    state.PAGES.update({p.title: p for p in pages})
    try:
        st.navigation(pages).run()
    except StoreError as exc:  # e.g. a job has held the store for too long: one line, no traceback
        st.error(one_line(exc))


if __name__ == "__main__":  # the script server.py serves
    main()
