"""Groups: GNQ distributions per group over checkpoints/epochs, with AUC separation (paper Fig. 3)."""

from __future__ import annotations

import streamlit as st

from gnq_core.analysis import group_separation
from gnq_core.dashboard import charts, show, state

st.title("Groups")
run = state.require_run()
db, version = str(state.db_path()), state.version(run.run_id)
traj = state.trajectories(db, run.run_id, version, None)
groups = sorted(g for g in traj["group"].dropna().unique()) if not traj.empty else []
if len(groups) < 1:
    st.info("This run's dataset has no group column (e.g. 'common' / 'surprising'). Give one with "
            "--group-column, or pick it on New audit.")
    st.stop()
shown = st.multiselect("Groups", groups, default=groups[:4])
show.chart(charts.group_distributions(traj, groups=shown), width="stretch")

if len(groups) >= 2:
    c1, c2 = st.columns(2)
    pos = c1.selectbox("Expected higher GNQ", groups,
                       index=groups.index("surprising") if "surprising" in groups else 0)
    neg = c2.selectbox("Expected lower GNQ", [g for g in groups if g != pos])
    sep = group_separation(traj, positive=pos, negative=neg)
    st.dataframe(sep.drop(columns="point").rename(columns={"label": "checkpoint"}), hide_index=True,
                 width="stretch")
    st.caption(f"AUC: the probability that a random '{state.plain(pos)}' text has higher GNQ than a random "
               f"'{state.plain(neg)}' one "
               "at that checkpoint (0.5 = no separation, 1 = perfect).")
