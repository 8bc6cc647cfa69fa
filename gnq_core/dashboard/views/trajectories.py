"""Trajectories: GNQ per example across checkpoints or epochs (paper Fig. 5, Table 4)."""

from __future__ import annotations

import streamlit as st

from gnq_core.analysis import masked, top_bottom
from gnq_core.dashboard import charts, show, state

MAX_LINES = 300  # above this, the rest of the run is drawn as a quantile band

st.title("Trajectories")
run = state.require_run()
db, version, _, scored = state.require_scores(run)

c1, c2, c3 = st.columns([1, 1, 2])
k = c1.number_input("Highlight top/bottom k", min_value=0, max_value=50, value=3)
by_group = c2.toggle("Colour by group", value=scored["group"].notna().any())
choices = scored.sort_values("gnq_rank")
text_of = dict(zip(scored["example_id"], scored["text"], strict=True))
picked = c3.multiselect("Pick examples", choices["example_id"].tolist(),
                        format_func=lambda i: f"#{i} · {state.short(text_of[i], 50)}",
                        key="traj_pick")
top_ids = scored.nsmallest(int(k), "gnq_rank")["example_id"].tolist()
bottom_ids = scored.nlargest(int(k), "gnq_rank")["example_id"].tolist()

if len(scored) <= MAX_LINES:
    ids, band = None, None
else:  # large run: draw the highlighted lines over the run's 10–90% band
    ids = tuple(sorted(set(top_ids + bottom_ids + picked)))
    band = state.trajectory_band(db, run.run_id, version)
traj = state.trajectories(db, run.run_id, version, ids)
fig = charts.trajectories(traj, highlight_top=top_ids, highlight_bottom=bottom_ids, selected=picked,
                          color_by_group=by_group, band=band,
                          texts=text_of)
event = show.chart(fig, width="stretch", on_select="rerun", selection_mode="points", key="traj_chart")
if sel := state.selected_points(event):
    state.open_example(sel[0])
st.caption(f"{len(scored):,} examples; "
           + ("every trajectory drawn." if band is None
              else "grey band: 10–90% of all examples, line: median."))

st.subheader("Highest and lowest GNQ_total (paper Table 4)")
high, low = top_bottom(scored, k=max(int(k), 1))  # the k highlighted above
for title, frame in (("Highest", high), ("Lowest", low)):
    st.markdown(f"**{title}**")
    show.table(frame[["example_id", "gnq_rank", "gnq_total", "copies", "group", "extracted", "text"]],
               f"tb_{title}")

tracked = state.store().secret_tracking(run.run_id)
if len(tracked):
    st.subheader("Secret values while training")
    names = {(k, v): f"{k} {masked(v)}, text {int(e)}"
             for (k, v), e in tracked.groupby(["kind", "value"])["example_id"].min().items()}
    show.chart(charts.secret_tracking(tracked, names), width="stretch", key="traj_secrets")
    out = tracked[tracked["leaked"]].groupby(["kind", "value"])["step"].min()
    st.caption(f"{tracked.groupby(['kind', 'value']).ngroups} value(s) probed at {tracked['step'].nunique()} "
               f"step(s) under the weights of that step (GNQConfig track_secrets); {len(out)} came out whole"
               + (f", the first at step {int(out.min())}" if len(out) else "")
               + ". Exposure: log2 of the value's space − log2 of its rank by the model's likelihood; "
                 "dotted: the 99th percentile of never-trained values of its format (exposed above it).")
