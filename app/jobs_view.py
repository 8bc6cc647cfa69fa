"""The live job list (progress per checkpoint, cancel), shared by the Runs and New audit pages."""

from __future__ import annotations

import time
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
                step = (f" · step {job.step + 1}/{len(job.steps)} (`gnq {' '.join(job.steps[job.step][:1])}`)"
                        if job.steps else "")
                head.markdown(f"**{state.plain(job.run)}** · {job.status}{step}  \n"
                              f"started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(job.started))}"
                              f" · {'took' if job.finished else 'running for'} "
                              f"{duration((job.finished or time.time()) - job.started)}")
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
                    results_link(job.run, key=f"open-{job.job_id}")
        if any(j.status in ("done", "cancelled", "failed") and j.finished and
               j.finished > st.session_state.get("_jobs_seen", 0) for j in jobs):
            st.session_state["_jobs_seen"] = max(j.finished or 0 for j in jobs)
            st.rerun(scope="app")

    panel()


def duration(seconds: float) -> str:
    """42 s, 3 min 05 s, 1 h 02 min."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def results_link(run: str, key: str) -> None:
    """A link to the finished run's results (the Runs page with the run picked, as a URL)."""
    if "Runs" in state.PAGES:
        st.page_link(state.PAGES["Runs"], label=f"Open the results of {state.plain(run)}",
                     icon=":material/arrow_forward:", query_params={"run": run})
    elif st.button(f"Open the results of {state.plain(run)}", key=key):  # a page run on its own (tests)
        st.session_state[state.RUN_KEY] = run
        st.query_params["run"] = run
        st.rerun(scope="app")
