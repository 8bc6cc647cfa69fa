"""Extraction vs GNQ: attack success per GNQ_total quantile bin (paper Fig. 6), the targeted
attack table: extracted among the top-k by GNQ vs by loss vs random (paper Table 3), and how
well each signal predicts the attack's outcome (analysis.predictive); the run's HTML report."""

from __future__ import annotations

import streamlit as st

from gnq_core.analysis import clusters as cl
from gnq_core.analysis import evidence as ev
from gnq_core.analysis import predictive as pr
from gnq_core.analysis import quantile_bins, roc_figure, targeted_attack_table
from gnq_core.dashboard import charts, show, state

st.title("Extraction vs GNQ")
run = state.require_run()
db, version = str(state.db_path()), state.version(run.run_id)
report_key = f"report:{db}:{run.run_id}:{version}"
if st.button("Prepare the run's report (HTML)", help="One self-contained file: provenance, verdict table, "
             "predictive power and the top flagged texts; opens offline, to hand on."):
    st.session_state[report_key] = state.report_html(db, run.name, version)
if report_key in st.session_state:
    st.download_button("Download the report", st.session_state[report_key], mime="text/html",
                       file_name=f"{run.name}-report.html".replace("/", "_"))
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
show.chart(charts.extraction_vs_quantile(frame), width="stretch")
rate = float((attacked["extraction_match"] >= threshold).mean())
st.caption(f"{len(attacked):,} texts attacked; overall success rate {rate:.1%} at match ≥ {threshold:g}.")

st.subheader("Targeted attack: who is extracted among the top-k?")
table = targeted_attack_table(attacked, threshold=threshold)
st.dataframe(table, hide_index=True, width="stretch",
             column_config={c: st.column_config.NumberColumn(format="%.3f")
                            for c in ("by_gnq", "by_loss", "by_self_influence", "random_mean", "random_std")})
st.caption("Rates of successful extraction among the k texts ranked highest by GNQ_total, lowest by loss, "
           "highest by the gradient norm² (self-influence K_jj), and k random texts (mean ± std over seeds).")
if attacked["group"].notna().any():
    st.subheader("By group")
    by_group = (attacked.assign(success=attacked["extraction_match"] >= threshold)
                .groupby("group").agg(texts=("example_id", "size"), success_rate=("success", "mean"),
                                      median_gnq_total=("gnq_total", "median")).reset_index())
    st.dataframe(by_group, hide_index=True)

st.subheader("Which signal predicts extraction?")
result, roc, provenance = state.predictive(db, run.name, version)
data = state.evidence(db, run.name, version)
st.markdown(pr.best_signal_sentence(result))
st.markdown(pr.within_length_sentence(result) + " " + ev.gain_sentence(data.evidence))
table = ev.display(data.evidence, "extraction")
if table.empty:  # said in words; the best-signal sentence above gives the counts too
    st.markdown("No signal can be scored against extraction: the attack needs both extracted and kept "
                f"texts ({int(attacked['extracted'].fillna(False).sum())} of {len(attacked)} extracted).")
else:
    st.dataframe(table, hide_index=True, width="stretch", column_config={
        "direction": st.column_config.TextColumn(
            help="Fixed before looking at the outcome: which end of the signal should mean 'extracted'. "
                 "AUC below 0.5 means the signal points the other way on this run."),
        "AUC within exact length": st.column_config.TextColumn(
            help="Only an extracted and a kept text of the same token length are compared: a signal "
                 "that only tracks length scores 0.5 here."),
        "CV AUC gain over length + loss": st.column_config.TextColumn(
            help="Cross-validated AUC of a logistic model on length (spline) + loss + this signal, "
                 "minus that of length + loss: what the signal adds. For loss: over length alone.")})
records = ev.display(data.evidence, "extraction", unit=cl.UNIT_RECORDS)
st.markdown("**Unit: records** (copies collapsed to one record: what the texts' tables rest on, counted "
            "once). " + ev.gain_sentence(data.evidence, unit=cl.UNIT_RECORDS))
if len(records):
    st.dataframe(records, hide_index=True, width="stretch")
st.caption("Outcome: the stored attack's own rule (not the slider above); signals read at the attacked "
           "point. " + ev.method(data.resamples, data.seed, data.level) + " " + state.plain(provenance))
log_fpr = st.toggle("Logarithmic false-positive axis (the low-FPR region)", value=True)
show.chart(roc_figure(roc, result, log_fpr=log_fpr, template=None), width="stretch")
with st.expander("Precision among the top-ranked texts"):
    st.dataframe(pr.display_table(result), hide_index=True, width="stretch")
    st.caption(result.method())
for (outcome, positive), _ in data.evidence[(data.evidence["outcome"] != "extraction")
                                            & (data.evidence["unit"] == cl.UNIT_TEXTS)].groupby(
        ["outcome", "positive"], sort=False):
    title = ("Members vs non-members" if outcome == "membership"
             else f"{state.plain(positive)} vs the other texts")
    with st.expander(f"Same signals, another outcome: {title}"):
        st.dataframe(ev.display(data.evidence, outcome, positive), hide_index=True, width="stretch")
        st.caption("Unit: records (copies collapsed to one record)")
        st.dataframe(ev.display(data.evidence, outcome, positive, unit=cl.UNIT_RECORDS), hide_index=True,
                     width="stretch")
        if outcome == "membership":  # the field's view: TPR at low FPR on a log axis
            table = data.evidence
            rows = table[(table["outcome"] == outcome) & (table["scope"] == ev.SCOPE_ALL)
                         & (table["unit"] == cl.UNIT_TEXTS)]
            points = pr.roc_points(data.frame, outcome="member")
            show.chart(roc_figure(points, rows, log_fpr=True, template=None, positive="member",
                                  negative="non-member"), width="stretch")
