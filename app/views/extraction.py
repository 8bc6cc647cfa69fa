"""Extraction vs GNQ: attack success per GNQ_total quantile bin (paper Fig. 6) and the targeted
attack table: extracted among the top-k by GNQ vs by loss vs random (paper Table 3)."""

from __future__ import annotations

import streamlit as st

from app import charts, state
from gnq_core.analysis.summaries import quantile_bins, targeted_attack_table

st.title("Extraction vs GNQ")
run = state.require_run()
db, version = str(state.db_path()), state.version(run.run_id)
totals = state.totals(db, run.run_id, version)
attacked = totals[totals["extraction_match"].notna() & totals["gnq_total"].notna()]
if attacked.empty:
    st.info(f"No extraction attack stored for run {state.plain(repr(run.name))}. Run "
            f"`gnq extract --run {run.name.replace('`', '')}` "
            "(or tick the attack on New audit).")
    st.stop()

c1, c2 = st.columns(2)
bins = c1.slider("Quantile bins", 2, 20, 10)
threshold = c2.slider("Success threshold (match fraction of the continuation)", 0.0, 1.0, 1.0, 0.01)
frame = quantile_bins(attacked, bins=bins, threshold=threshold)
st.plotly_chart(charts.extraction_vs_quantile(frame), width="stretch")
rate = float((attacked["extraction_match"] >= threshold).mean())
st.caption(f"{len(attacked):,} texts attacked; overall success rate {rate:.1%} at match ≥ {threshold:g}.")

st.subheader("Targeted attack: who is extracted among the top-k?")
table = targeted_attack_table(attacked, threshold=threshold)
st.dataframe(table, hide_index=True, width="stretch",
             column_config={c: st.column_config.NumberColumn(format="%.3f")
                            for c in ("by_gnq", "by_loss", "by_self_influence", "random_mean", "random_std")})
st.caption("Rates of successful extraction among the k texts ranked highest by GNQ_total, lowest by loss, "
           "highest by self-influence K_jj, and k random texts (mean ± std over seeds).")
if attacked["group"].notna().any():
    st.subheader("By group")
    by_group = (attacked.assign(success=attacked["extraction_match"] >= threshold)
                .groupby("group").agg(texts=("example_id", "size"), success_rate=("success", "mean"),
                                      median_gnq_total=("gnq_total", "median")).reset_index())
    st.dataframe(by_group, hide_index=True)
