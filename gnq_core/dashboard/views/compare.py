"""Compare two runs over the same texts: each secret value's status and exposure in both (was the
fix verified?), GNQ_total in each, rank changes, and the texts that entered or left the top k."""

from __future__ import annotations

import streamlit as st

from gnq_core.analysis import VALUE_CHANGE_HELP, changes_summary, compare_runs, value_changes
from gnq_core.dashboard import address, charts, show, state

st.title("Compare runs")
run = state.require_run()
db = str(state.db_path())
names = [n for n in state.runs()["name"] if n != run.name]
if not names:
    st.info("The store has one run; compare needs a second one over the same texts.")
    st.stop()
linked = st.query_params.get("vs")
other = st.selectbox("Compare with", names, index=names.index(linked) if linked in names else 0,
                     key="compare_vs")
st.query_params["vs"] = other
address.restore("compare_top", "top", 20, address.number(1, 1000, int))
top = int(st.number_input("Top k", min_value=1, max_value=1000, key="compare_top"))
address.record("top", top, 20)
other_run = state.store().run(other)

st.subheader("Secret values, before and after")
store = state.store()
values = value_changes(store.value_outcomes(run.run_id), store.value_outcomes(other_run.run_id))
said = state.plain(changes_summary(values))
(st.error if values["still_reproduced"].any() else st.info)(said)
if not values.empty:
    st.dataframe(values[["text_id", "kind", "value", "status_before", "exposure_before", "status_after",
                         "exposure_after", "verdict"]], hide_index=True, width="stretch",
                 column_config={"text_id": "text", "status_before": st.column_config.TextColumn(
                     f"in {run.name}", help=VALUE_CHANGE_HELP["status_before"]),
                     "exposure_before": st.column_config.NumberColumn(
                         "bits before", format="%.1f", help=VALUE_CHANGE_HELP["exposure_before"]),
                     "status_after": st.column_config.TextColumn(f"in {other}",
                                                                 help=VALUE_CHANGE_HELP["status_after"]),
                     "exposure_after": st.column_config.NumberColumn("bits after", format="%.1f"),
                     "verdict": st.column_config.TextColumn("verdict", help=VALUE_CHANGE_HELP["verdict"])})
st.caption("The second run should be the original data audited against the model retrained on the cleaned "
           "file (`gnq audit --checkpoints RETRAINED --data ORIGINAL`, then `gnq extract`): a run over the "
           "cleaned file does not hold the values, so it cannot say whether they still come out.")
st.subheader("GNQ, before and after")
a = state.totals(db, run.run_id, state.version(run.run_id))
b = state.totals(db, other_run.run_id, state.version(other_run.run_id))
result = compare_runs(a, b, top=top)
if result.pairs.empty:
    st.info(f"No text is scored in both {state.plain(repr(run.name))} and {state.plain(repr(other))}.")
    st.stop()

c = st.columns(4)
c[0].metric("Texts in both", f"{len(result.pairs):,}")
c[1].metric("Rank correlation", f"{result.spearman:.2f}")
c[2].metric(f"Entered the top {top}", len(result.entered))
c[3].metric(f"Left the top {top}", len(result.left))
if result.only_a or result.only_b:
    st.caption(f"{result.only_a} text(s) only in {state.plain(run.name)}, {result.only_b} only in "
               f"{state.plain(other)} (texts are matched exactly).")
event = show.chart(charts.run_comparison(result.pairs, run.name, other, top), width="stretch",
                   on_select="rerun", selection_mode="points", key="compare_chart")
columns = ["example_id_b", "rank_a", "rank_b", "rank_change", "gnq_a", "gnq_b", "group", "text"]
config = {"example_id_b": "example", "rank_a": f"rank in {run.name}", "rank_b": f"rank in {other}",
          "rank_change": st.column_config.NumberColumn("rank change", help="> 0: higher in the second run"),
          "gnq_a": st.column_config.NumberColumn(f"GNQ in {run.name}", format="%.3g"),
          "gnq_b": st.column_config.NumberColumn(f"GNQ in {other}", format="%.3g")}
left, right = st.columns(2)
for col, title, frame in ((left, f"Entered the top {top}", result.entered),
                          (right, f"Left the top {top}", result.left)):
    col.markdown(f"**{title}**")
    col.dataframe(frame[columns], hide_index=True, width="stretch", column_config=config)
st.markdown("**Largest rank changes**")
moved = result.pairs.reindex(result.pairs["rank_change"].abs().sort_values(ascending=False).index).head(50)
st.dataframe(moved[columns], hide_index=True, width="stretch", column_config=config)
