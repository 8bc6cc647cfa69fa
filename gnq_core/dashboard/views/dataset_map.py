"""Dataset map: every text as a point, GNQ_total against its loss, coloured by group or by the
attack's verdict; lasso- or box-select points to filter the table below (as Dataset Cartography
maps training dynamics)."""

from __future__ import annotations

import streamlit as st

from gnq_core.dashboard import address, charts, show, state
from gnq_core.dashboard.columns import column_config

st.title("Dataset map")
run = state.require_run()
scored = state.require_scores(run)[3]

attacked = scored["extracted"].notna().any()
colours = ["group", "attack verdict"] if attacked else ["group"]
address.restore("map_colour", "colour", "group", address.one_of(colours))
colour = st.radio("Colour by", colours, horizontal=True, key="map_colour")
address.record("colour", colour, "group")
shown = scored if colour == "group" else scored.assign(
    group=scored["extracted"].map({True: "extracted", False: "not extracted"}).fillna("too short"))
event = show.chart(charts.gnq_vs_loss(shown), width="stretch", on_select="rerun",
                   selection_mode=("points", "box", "lasso"), key="map_chart")
picked = set(state.selected_points(event))
view = scored[scored["example_id"].isin(picked)] if picked else scored
st.caption(f"{len(picked):,} texts selected on the map (lasso or box in the chart's toolbar; double-click "
           "to clear)." if picked else f"All {len(scored):,} texts. Lasso or box-select points on the map "
           "to list only those.")
columns = ["example_id", "rank", "gnq_total", "loss_last", "group", "extracted", "text"]
table = view.sort_values("rank")[columns]
show.table(table, "map_table", {**column_config(table),
                                 "gnq_total": st.column_config.NumberColumn(format="%.3g"),
                                 "loss_last": st.column_config.NumberColumn("loss", format="%.3f")})
