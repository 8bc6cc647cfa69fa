"""The live job list (progress per checkpoint, cancel), shared by the Runs and New audit pages."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from app import state
from gnq_core.pipelines.jobs import cancel_job, list_jobs


def job_panel(db: Path, only_alive: bool = False) -> None:
    @st.fragment(run_every=1.5)
    def panel() -> None:
        jobs = list_jobs(db)
        if only_alive:
            jobs = [j for j in jobs if j.alive()]
        if not jobs:
            return
        st.subheader("Jobs")
        runs = state.store().runs()
        for job in jobs[:10]:
            row = runs[runs["name"] == job.run]
            with st.container(border=True):
                head, button = st.columns([5, 1])
                head.markdown(f"**{state.plain(job.run)}** · {job.status} · step {job.step + 1}/"
                              f"{len(job.steps)} (`{state.plain(job.step_kind())}`)")
                if job.alive() and button.button("Cancel", key=f"cancel-{job.job_id}"):
                    cancel_job(job)
                    st.rerun()
                if not row.empty and job.status == "running":
                    r = row.iloc[0]
                    done, total = int(r["progress_done"] or 0), int(r["progress_total"] or 0)
                    st.progress(done / total if total else 0.0,
                                text=f"{state.plain(r['progress_note'] or '')}: {done}/{total} examples · "
                                     f"{int(r['points_done'])}/{int(r['points_total'])} checkpoints done")
                elif job.status == "running":
                    st.progress(0.0, text="starting…")
                if job.status == "failed":
                    error = job.error_line()
                    st.error(f"Job failed: {state.plain(error.removeprefix('error: '))}" if error
                             else f"Job failed (exit code {job.returncode}).")
                    st.code(job.log_tail(), language=None)
                if job.status == "done" and not only_alive:
                    st.success("Finished. Pick the run in the sidebar.")
        if any(j.status in ("done", "cancelled", "failed") and j.finished and
               j.finished > st.session_state.get("_jobs_seen", 0) for j in jobs):
            st.session_state["_jobs_seen"] = max(j.finished or 0 for j in jobs)
            st.rerun(scope="app")

    panel()
