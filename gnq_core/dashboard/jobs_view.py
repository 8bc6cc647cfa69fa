"""The live job list (progress per checkpoint, cancel), shared by the Runs and New audit pages.

Drawn from the store's job files alone (gnq_core.jobs), nothing in the session: any session, a
reload or another browser, lists every job and can cancel a running one.  Each job is one line of
the run's history: its outcome and the reason (jobs.history.outcome)."""

from __future__ import annotations

import time
from pathlib import Path

import streamlit as st

from gnq_core.dashboard import state
from gnq_core.jobs import cancel_job, list_jobs, outcome
from gnq_core.pipelines import duration, job_seconds_left, seconds_left


def job_panel(db: Path, only_alive: bool = False) -> None:
    @st.fragment(run_every=1.5)
    def panel() -> None:
        every = list_jobs(db)
        jobs = [j for j in every if j.alive()] if only_alive else every
        if jobs:
            st.subheader("Jobs")
        for job in jobs[:10]:
            with st.container(border=True):
                head, button = st.columns([5, 1])
                said = state.plain(outcome(job))
                line = said if job.status != "failed" else "failed"  # the reason: the red box below
                head.markdown(f"**{state.plain(job.run)}** · {line}  \n"
                              f"started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(job.started))}")
                alive = job.alive()
                if alive and job.cancel_requested() is not None:
                    button.caption("Cancelling: it stops at its next batch…")
                elif alive and button.button("Cancel", key=f"cancel-{job.job_id}"):
                    cancel_job(job)
                    st.rerun()
                if job.status == "running":
                    progress_bar(job.progress())
                if job.status == "failed":
                    st.error(f"Job {said}")
                    st.code(job.log_tail(), language=None)
                if job.status == "done" and not only_alive:
                    results_link(job.run, key=f"open-{job.job_id}")
        last = max((j.finished or 0 for j in every), default=0)
        if "_jobs_seen" not in st.session_state:  # jobs that ended before the page was opened
            st.session_state["_jobs_seen"] = last
        if last > st.session_state["_jobs_seen"]:  # one ended while it was open: redraw the pages
            st.session_state["_jobs_seen"] = last
            st.rerun(scope="app")

    panel()


def progress_bar(progress: dict | None) -> None:
    """The running step's stage, count and estimated time left (from the job's progress file:
    the store, which the job is writing to, is not opened)."""
    if not progress:
        st.progress(0.0, text="starting…")
        return
    done, total = int(progress.get("done") or 0), int(progress.get("total") or 0)
    planned, stage = progress.get("planned_stages"), progress.get("stage") or 0
    left = seconds_left(progress)
    unit = state.plain(progress.get("unit") or "texts")  # what this stage counts, in its own word
    if done >= total:
        when = " · finishing this stage…"
    elif left is None:
        when = " · measuring this stage's rate…"
    else:
        when = f" · about {duration(left)} left in this stage"
        if (whole := job_seconds_left(progress)) is not None and whole > left:
            when += f", about {duration(whole)} in all"
    text = (f"{state.plain(progress.get('label') or '')}: {done}/{total} {unit}"
            + (f" · stage {stage} of {planned}" if planned else "") + when)
    fraction = (stage - 1 + (done / total if total else 0)) / planned if planned and stage else (
        done / total if total else 0.0)
    st.progress(min(max(fraction, 0.0), 1.0), text=text)


def results_link(run: str, key: str) -> None:
    """A link to the finished run's results (the Runs page with the run picked, as a URL)."""
    if "Runs" in state.PAGES:
        st.page_link(state.PAGES["Runs"], label=f"Open the results of {state.plain(run)}",
                     icon=":material/arrow_forward:", query_params={"run": run})
    elif st.button(f"Open the results of {state.plain(run)}", key=key):  # a page run on its own (tests)
        st.session_state[state.RUN_KEY] = run
        st.query_params["run"] = run
        st.rerun(scope="app")
