"""Flagged texts: filter, sort, and download exactly the filtered view."""

from __future__ import annotations

import streamlit as st

from app import state
from gnq_core.results.export import export_frame, to_bytes

st.title("Flagged texts")
run = state.require_run()
scored = state.require_scores(run)[3]

c1, c2, c3 = st.columns(3)
mode = c1.radio("Flag by", ["top-k", "percentile", "GNQ threshold"], horizontal=True)
if mode == "top-k":
    k = c2.number_input("k", min_value=1, max_value=len(scored), value=min(50, len(scored)))
    view = scored[scored["rank"] <= k]
elif mode == "percentile":
    p = c2.slider("At or above percentile", 0.0, 100.0, 90.0, 0.5)
    view = scored[scored["percentile"] >= p]
else:
    x = c2.number_input("GNQ_total at least", value=float(scored["gnq_total"].quantile(0.9)), format="%g")
    view = scored[scored["gnq_total"] >= x]
search = c3.text_input("Text contains", placeholder="search…")
c1, c2 = st.columns(2)
groups = sorted(scored["group"].dropna().unique())
picked = c1.multiselect("Groups", groups, default=[])
has_attack = scored["extraction_match"].notna().any()
extracted = c2.radio("Extraction", ["all", "extracted", "not extracted"], horizontal=True,
                     disabled=not has_attack)
if picked:
    view = view[view["group"].isin(picked)]
if search:
    view = view[view["text"].str.contains(search, case=False, regex=False)]
if has_attack and extracted != "all":
    view = view[view["extracted"].fillna(False) == (extracted == "extracted")]

out = export_frame(view.sort_values("rank"), has_attack)
st.caption(f"{len(out):,} of {len(scored):,} texts")
event = st.dataframe(out, hide_index=True, width="stretch", on_select="rerun",
                     selection_mode="single-row", key="flagged_table",
                     column_config={"gnq_total": st.column_config.NumberColumn(format="%.3g"),
                                    "gnq_max": st.column_config.NumberColumn(format="%.3g"),
                                    "gnq_last": st.column_config.NumberColumn(format="%.3g"),
                                    "gnq_mean": st.column_config.NumberColumn(format="%.3g"),
                                    "percentile": st.column_config.NumberColumn(format="%.1f")})
if sel := state.selected_rows(event, out):
    state.open_example(sel[0])
c = st.columns(3)
for col, fmt, mime in zip(c, ("csv", "jsonl", "parquet"),
                          ("text/csv", "application/jsonl", "application/vnd.apache.parquet"), strict=True):
    col.download_button(f"Download {fmt.upper()}", to_bytes(out, fmt), file_name=f"{run.name}-flagged.{fmt}",
                        mime=mime, width="stretch")
