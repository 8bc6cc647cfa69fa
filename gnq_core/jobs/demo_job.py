"""The demo as a detached dashboard job (``make app`` and ``gnq demo --background``): started
unless its runs are built or being built.  Apart from ``demo`` (what the demo builds) because it
goes through ``jobs``, whose job process runs ``run_job``, which builds the demo."""

from __future__ import annotations

from gnq_core.jobs.jobs import list_jobs, start_job
from gnq_core.pipelines.demo import AUDIT_RUN, TRAIN_RUN
from gnq_core.results.store import Store


def start_demo_job(store: Store, job) -> str:
    """Start the demo as a detached dashboard job (jobs/jobs.py) unless it is built or being
    built; one line saying which.  ``make app`` calls this so the dashboard answers at once."""
    built = store.find_run(AUDIT_RUN) is not None and store.find_run(TRAIN_RUN) is not None
    if built and all(store.run(n).status == "done" for n in (AUDIT_RUN, TRAIN_RUN)) and not any(
            store.extractions(store.run(n).run_id).empty for n in (AUDIT_RUN, TRAIN_RUN)):
        return f"The demo runs are in {store.path} already."
    if any(j.run == "demo" and j.alive() for j in list_jobs(store.path)):
        return "The demo is being built in the background; the dashboard's Runs page shows its progress."
    started = start_job("demo", store.path, [job])
    return (f"Building the demo in the background (pid {started.pid}, log {started.log}); the dashboard's "
            "Runs page shows its progress and its results when it is done.")
