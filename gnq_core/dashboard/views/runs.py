"""Runs: the selected run's leaked texts with their reasons first, then what is in the store, a GNQ
histogram and the top of the verdict order."""

from __future__ import annotations

import streamlit as st

from gnq_core import one_line
from gnq_core.analysis import (
    ACT_ON,
    DEFAULT_ACT_ON,
    LEAKED,
    PARTLY,
    VALUES_HELP,
    RemediationOptions,
    exposure_summary,
    fdr_sentence,
    gnq_nature,
    needs_data,
    null_sentence,
    remediate_run,
    run_counts,
    summary,
    values_table,
)
from gnq_core.dashboard import charts, show, state
from gnq_core.dashboard.jobs_view import job_panel
from gnq_core.jobs import list_jobs, start_job
from gnq_core.pipelines import DemoJob

LEAKED_STATUSES = (LEAKED, PARTLY)


def leaked_texts(run) -> None:
    """What actually leaked from this run, each text with its reason, above everything else."""
    totals = state.totals(str(state.db_path()), run.run_id, state.version(run.run_id))
    attack = run.settings.get("attack") or {}
    # leaked and partly leaked: a secret value (or, for a text without one, the text) came out
    leaked = totals[totals["status"].isin(LEAKED_STATUSES)] if "status" in totals else totals.iloc[0:0]
    st.subheader(f"What leaked from {state.plain(repr(run.name))}")
    if totals["extraction_match"].notna().sum() == 0:
        st.caption("No extraction attack stored for this run yet (`gnq extract`).")
        return
    secret_rule = f" {state.plain(attack['secret_rule'])}." if attack.get("secret_rule") else ""
    rule = f" Rule: {state.plain(attack['rule'])}.{secret_rule}" if attack.get("rule") else ""
    exposure = exposure_summary(state.store(), run.run_id)
    counts = run_counts(totals, exposure)  # the headline's numbers: one object (analysis/counts.py)
    tiles(counts, exposure)
    said = state.plain(summary(totals, counts))
    if leaked.empty:
        st.success(f"{said}")
    else:  # a partial leak alone is a warning, not "nothing leaked"
        (st.error if counts.status(LEAKED) else st.warning)(said)
        show.texts(leaked, key="runs_leaked_pick")
    st.caption(rule.strip())
    if leaked.empty:
        return
    with st.expander("All columns (select a row to open its drill-down)"):
        tokenised = show.tokenised_toggle(leaked, "runs_leaked_tokenised")
        cols = ["text", "status", "reason", "copies", "secret", "example_id", *show.layout_column(leaked)]
        show.table(show.readable(leaked[cols], tokenised), "runs_leaked")


def tiles(counts, said: dict) -> None:
    """The first screen's numbers: texts leaked whole, in part, and the secret values exposed."""
    c1, c2, c3 = st.columns(3)
    c1.metric("Leaked", f"{counts.status(LEAKED)} / {counts.texts}",
              help="Texts whose secret-like value the model writes whole, or, without one, whose window "
                   f"it writes word for word. Also: {counts.status('text reproduced')} text reproduced (the "
                   f"window, not the value); {counts.window_reproduced} of {counts.window_attacked} windows "
                   f"came out; {counts.values_leaked} of {counts.values_attacked} secret-like values came "
                   "out whole.")
    c2.metric("Partly leaked", f"{counts.status(PARTLY)} / {counts.texts}",
              help="Texts of which part of a secret-like value's own part comes out (at least 3 of the "
                   "characters neither the run's template nor the kind's format fixes, beyond what "
                   "never-trained values of the template match by chance, more than the reference model "
                   "writes), or a different value sharing them: scrub the value and retrain or unlearn, "
                   "and change it. "
                   f"{counts.values_partly} of {counts.values_attacked} secret-like values came out in part.")
    if said["values"]:  # the report's verdict.counts.values_exposed: the same count
        c3.metric("Exposed values", f"{counts.values_exposed} / {counts.values_distinct}",
                  help="Distinct secret values the model ranks higher than a never-trained value would, "
                       "written or not, at a stated false-alarm rate: " + fdr_sentence(said)
                       + f" ({said['exact']} ranks exact, {said['estimated']} estimated): see **Secret "
                       "values: exposure** below.")


def secret_exposure(run) -> None:
    """Each distinct secret value's exposure beside the reference's and its format's null."""
    said = exposure_summary(state.store(), run.run_id)
    if not said["values"]:
        return
    estimated = f", {said['estimated']} estimated" if said["estimated"] else ""
    with st.expander(f"Secret values: exposure ({said['distinct_values']} distinct, {said['exact']} exact"
                     f"{estimated}; {said['exposed']} exposed)"):
        st.caption("Exposure = log2 of the value's space (its free digits) − log2 of its rank there by the "
                   "model's likelihood. " + state.plain(fdr_sentence(said))
                   + " Hover a column's name for what it means.")
        table = values_table(said)
        st.dataframe(table, hide_index=True, width="stretch",
                     column_config={c: st.column_config.Column(c, help=VALUES_HELP.get(c)) for c in table})
        st.markdown("**Never-trained values of each format** (the control)")
        for fmt in said["formats"]:
            st.caption(state.plain(null_sentence(fmt)))


def act_on_verdict(run) -> None:
    """The cleaned training data, written by the function ``gnq remediate`` calls."""
    from pathlib import Path

    with st.expander("Act on the verdict: write the cleaned training data"):
        data = None
        if needs_data(run):  # a Trainer run records no file: the user names it, checked by its texts
            data = st.text_input("Training file", "", key="remediate_data",
                                 help="The file this run was trained on (.txt, .jsonl, .csv or .parquet): "
                                      "its texts must be the run's, same count, same order, equal.")
            column = st.text_input("Its text column", "text", key="remediate_text_column",
                                   help="For .csv, .jsonl and .parquet files.")
            if not data.strip():
                st.info("This run was trained in memory (the HF Trainer integration) and records no "
                        "training file: give its path above to write the cleaned copy.")
                return
        source = Path(data.strip()) if data else Path(run.dataset_path)
        st.caption("The training data in its own format with every value of the chosen statuses replaced, "
                   "each acted-on copy cluster reduced to one text, and a manifest (JSON) of every change "
                   "beside it: text, span, kind, SHA-256 of the old value, new value, reason. The same as "
                   "`gnq remediate`.")
        act = st.multiselect("Act on", ACT_ON, default=list(DEFAULT_ACT_ON), key="remediate_act_on",
                             help="leaked / partly-leaked / exposed: per value, wherever it occurs; secret: "
                                  "every secret-like value; text-reproduced: the values of texts whose "
                                  "window comes out; at-risk: repeated texts in the top 20% of risk.")
        surrogate = st.checkbox("Surrogates instead of placeholders", key="remediate_surrogate",
                                help="A random value of the same kind and format (checksum-valid), never a "
                                     "value of the data, instead of [REDACTED_CARD] and the like.")
        keep = st.checkbox("Keep every copy", key="remediate_keep_copies")
        out = st.text_input("Write to", str(source.with_name(f"{source.stem}.clean{source.suffix}")),
                            key="remediate_out")
        if st.button("Write the cleaned training data", key="remediate_go"):
            totals = state.totals(str(state.db_path()), run.run_id, state.version(run.run_id))
            try:
                options = RemediationOptions(act_on=tuple(act), surrogate=surrogate, keep_copies=keep)
                done = remediate_run(state.store(), run, totals, out, options, data=data,
                                     text_column=(column.strip() or None) if data and source.suffix != ".txt"
                                     else None)
            except (ValueError, OSError) as exc:
                st.error(state.plain(one_line(exc)))
            else:
                st.success(state.plain(done.summary()))


st.title("Runs")
# The running jobs first, from their own files: their progress and Cancel show at once, before
# anything waits for the store a job is writing (in any session, after a reload too).
job_panel(state.db_path(), only_alive=True)
if any(j.run == "demo" and j.alive() for j in list_jobs(state.db_path())):
    # The demo job is writing the store: the page answers at once on a busy machine.
    st.info("Building the demo: a tiny GPT-2 trained with in-run GNQ, its checkpoints audited, then "
            "attacked. This page fills in when it is done.")
    st.stop()
run = state.sidebar()
frame = state.runs()
if run is not None:
    leaked_texts(run)
    secret_exposure(run)
    act_on_verdict(run)

if frame.empty:
    st.markdown("This store has no runs yet. The **demo** trains a tiny GPT-2 on the project's own "
                "texts (common facts, surprising false claims and a few repeated fake customer records) "
                "with in-run GNQ, audits its checkpoints and runs the extraction attack — about a minute "
                "on a laptop CPU.")
    if st.button("Build the demo run", type="primary"):  # a demo already building stopped the page above
        start_job("demo", state.db_path(), [DemoJob()])
        st.rerun()
    st.stop()

cols = ["run_id", "name", "kind", "status", "n_examples", "points_done", "points_total", "lam", "batch_size",
        "seed", "max_length", "extraction_rows", "dataset_path", "model_path", "code_version", "updated_at"]
st.dataframe(frame[cols], hide_index=True, width="stretch",
             column_config={"run_id": "id", "n_examples": "examples", "points_done": "points done",
                            "points_total": "points", "lam": st.column_config.NumberColumn("λ", format="%g"),
                            "batch_size": "B", "max_length": "max len", "extraction_rows": "attacked"})
if run is None:
    st.stop()

version = state.version(run.run_id)
totals = state.totals(str(state.db_path()), run.run_id, version)
scored = totals[totals["gnq_total"].notna()]
st.subheader(f"Run {state.plain(repr(run.name))}")
c1, c2, c3 = st.columns(3)
c1.metric("Examples", f"{len(totals):,}")
c2.metric("Points (checkpoints / epochs)", int(totals["n_points"].max() or 0) if len(scored) else 0)
c3.metric("Median GNQ_total", f"{scored['gnq_total'].median():.3g}" if len(scored) else "–")

if sentence := gnq_nature.companion_sentence(run.settings):
    st.markdown("**Companion set.** " + state.plain(sentence))
nature = state.gnq_nature(str(state.db_path()), run.run_id, version)
st.markdown("**What GNQ is on this run.** " + nature["sentence"])
st.caption("K_jj = ‖g_j‖² is the gradient norm squared. Without batch companions GNQ = K_jj/λ; "
           "1 − GNQ·λ/K_jj (λ_eff for a relative λ) is the share of a gradient its companions explain. "
           "When it is small for every text, GNQ orders texts as the gradient norm does.")

left, right = st.columns(2)
with left:
    show.chart(charts.gnq_histogram(scored), width="stretch")
with right:
    event = show.chart(charts.gnq_vs_loss(scored), note="Click a point to open its text.", width="stretch",
                       on_select="rerun", selection_mode="points", key="runs_scatter")
    if ids := state.selected_points(event):
        state.open_example(ids[0])

st.subheader("Top flagged texts")
show.texts(scored.nsmallest(20, "rank"), key="runs_top_pick")
st.caption("The verdict order: leaked texts first, then secret-like content, then memorisation risk; "
           "copies of a text share one row (×N). Sort by GNQ alone on **Flagged texts**.")
show.risk_basis(totals)
with st.expander("All columns (select a row to open its drill-down)"):
    tokenised = show.tokenised_toggle(scored, "runs_top_tokenised")
    top = scored.nsmallest(20, "rank")[["text", "status", "reason", "example_id", "rank", "copies", "secret",
                                        "gnq_total", "risk", "extracted", "group",
                                        *show.layout_column(scored)]]
    show.table(show.readable(top, tokenised), "runs_top")
