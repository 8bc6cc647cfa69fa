"""A dashboard job runs its steps with run_job in its own process (pipelines/jobs.py): Cancel
marks the run 'cancelled' and keeps its finished checkpoints, and the same job run again resumes."""

from __future__ import annotations

import signal
import time

import pytest
from hostile.hostile_helpers import make_series, write_texts_csv

from gnq_core.jobs import Job, cancel_job, list_jobs, start_job
from gnq_core.jobs.jobs import run_steps
from gnq_core.pipelines import AuditJob, AuditSettings, job_dict
from gnq_core.results import Store

pytestmark = pytest.mark.slow


def test_cancel_keeps_finished_checkpoints_and_a_rerun_resumes(tmp_path):
    series = make_series(tmp_path / "series", 3, max_length=16)
    data = write_texts_csv(tmp_path / "t.csv", 120)
    db = tmp_path / "gnq.duckdb"
    step = AuditJob(checkpoints=str(series), data=str(data), name="c",
                    settings=AuditSettings(batch_size=3, max_length=16, dtype="float64"))
    job = start_job("c", db, [step])
    deadline = time.monotonic() + 120
    while not ((p := job.progress()) and p.get("stage", 0) >= 2):  # the first checkpoint is written
        assert time.monotonic() < deadline and list_jobs(db)[0].status == "running", job.log_tail()
        time.sleep(0.1)
    cancel_job(list_jobs(db)[0])
    while (ended := list_jobs(db)[0]).status == "running":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    store = Store(db)
    run = store.run("c")
    assert (ended.status, ended.returncode, run.status) == ("cancelled", 130, "cancelled")
    done = store.points(run.run_id).query("status == 'done'")
    assert 1 <= len(done) < 3
    first = store.scores(run.run_id, 0)

    again = Job(job_id="again", run="c", db=str(db), steps=[job_dict(step)])
    again.log = str(again.path.with_suffix(".log"))
    again.save()
    handler = signal.getsignal(signal.SIGTERM)
    try:
        assert run_steps(again.path) == 0  # in this process: the same function the job process runs
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert store.run("c").status == "done" and len(store.scores(run.run_id)) == 3 * 120
    assert store.scores(run.run_id, 0)["gnq"].tolist() == first["gnq"].tolist()  # resumed, not redone
