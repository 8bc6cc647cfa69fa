"""A run's jobs as a user meets them (gnq_core/jobs/jobs.py, jobs/history.py, dashboard/jobs_view.py):
one job per start, never two writing one run; every session lists and cancels them from the job
files; each reads as what happened, with its outcome and the reason.

The job processes here are stand-ins (a ``sleep`` in a session of its own, its pid in a job file),
so the tests take seconds: the real job process's cancel is tests/jobs/test_jobs.py's (slow) and the
browser's is tests/e2e/test_e2e_browser.py's.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time

import pytest
from hostile.hostile_helpers import DASHBOARD, app_page, rendered
from streamlit.testing.v1 import AppTest

from gnq_core.jobs import Job, JobConflict, cancel_job, list_jobs, outcome, start_job
from gnq_core.pipelines import AuditJob

STARTED = 1_700_000_000.0


def _shell(script: str) -> subprocess.Popen:
    """A stand-in job process running ``script`` in a session of its own, returned once its traps
    are set (a signal before them would end it as a plain kill)."""
    proc = subprocess.Popen(["sh", "-c", f"{script}"], start_new_session=True, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _sleeper() -> subprocess.Popen:
    """A stand-in job process, in a session of its own as start_job makes them (so killpg reaches it)."""
    return subprocess.Popen(["sleep", "60"], start_new_session=True)


def _job(db, proc: subprocess.Popen | None, run: str = "r", job_id: str = "20231114-221320-aaaaaa",
         **fields) -> Job:
    fields = {"status": "running", "pid": proc.pid if proc else None, "started": STARTED} | fields
    job = Job(job_id=job_id, run=run, db=str(db), steps=[{"kind": "audit"}, {"kind": "extract"}], **fields)
    job.log = str(job.path.with_suffix(".log"))
    job.save()
    return job


@pytest.fixture
def sleeper():
    proc = _sleeper()
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _gone(db, deadline: float = 10.0) -> Job:
    end = time.monotonic() + deadline
    while (job := list_jobs(db)[0]).status == "running":
        assert time.monotonic() < end, "the stand-in job is still listed as running"
        time.sleep(0.05)
    return job


def test_a_second_start_of_a_run_that_a_live_job_writes_is_refused(tmp_path, sleeper):
    """Two starts of one run would audit the same checkpoints into it at once (and show as one
    job done, one cancelled or failed): the second is refused in one line, no job file written."""
    db = tmp_path / "gnq.duckdb"
    _job(db, sleeper, run="my-audit")
    step = AuditJob(checkpoints=str(tmp_path), data=str(tmp_path / "t.csv"), name="my-audit")
    with pytest.raises(JobConflict, match=r"run 'my-audit' is being written by the job started at .*"
                                          r"cancel it first.*another name"):
        start_job("my-audit", db, [step])
    assert len(list_jobs(db)) == 1


def test_a_job_killed_by_sigkill_reads_as_killed_with_the_likely_reason(tmp_path):
    """The out-of-memory killer's SIGKILL leaves no word in the job's log: the dashboard that
    started the job reaps its exit status, so the history names the signal and what to change."""
    db = tmp_path / "gnq.duckdb"
    proc = _sleeper()
    _job(db, proc, step=0)
    os.kill(proc.pid, signal.SIGKILL)
    job = _gone(db)
    assert (job.status, job.returncode) == ("failed", -9)
    said = outcome(job)
    assert said.startswith("failed after ") and "during step 1 of 2 (audit)" in said
    assert "killed by SIGKILL" in said and "out-of-memory killer" in said and "smaller batch size" in said


def test_a_job_that_died_unseen_says_its_outcome_was_not_recorded(tmp_path):
    """A job process that is not this process's child (the dashboard was restarted) and died:
    nothing records how, and the line says so instead of inventing a reason."""
    db = tmp_path / "gnq.duckdb"
    # the shell starts the sleep in the background and exits: the sleep is no child of ours
    pid = int(subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True,
                             text=True, check=True).stdout)
    _job(db, None, pid=pid)
    assert list_jobs(db)[0].alive()
    os.kill(pid, signal.SIGKILL)
    job = _gone(db)
    assert job.status == "failed" and job.returncode is None
    assert "ended without recording an outcome" in outcome(job)


def test_cancel_from_any_session_is_recorded_and_read_back(tmp_path, sleeper):
    """Cancel notes that it was pressed (a file beside the job's, not the session), then stops
    the job's process group; the line then says who cancelled and what is kept."""
    db = tmp_path / "gnq.duckdb"
    _job(db, sleeper, step=1)
    other_session = list_jobs(db)[0]  # as a page in another browser reads it
    before = time.time()
    cancel_job(other_session)
    assert sleeper.wait(timeout=10) == -signal.SIGTERM
    asked = list_jobs(db)[0].cancel_requested()
    assert asked is not None and before <= asked <= time.time()
    done = Job(job_id="x", run="r", db=str(db), steps=[{"kind": "audit"}, {"kind": "extract"}],
               status="cancelled", step=1, started=STARTED, finished=STARTED + 53)
    said = outcome(done)  # no request file for this one: cancelled from outside
    assert said == ("cancelled by a signal from outside the dashboard (Ctrl-C or kill), after 53 s during "
                    "step 2 of 2 (extract), after the audit finished: what it finished is kept; starting "
                    "it again resumes")
    done.cancel_path.write_text(f'{{"at": {STARTED + 50}}}')
    assert outcome(done).startswith(f"cancelled from the dashboard at "
                                    f"{time.strftime('%H:%M:%S', time.localtime(STARTED + 50))}, after 53 s")


def test_the_history_lists_the_latest_start_first_whatever_the_job_ids(tmp_path):
    """A job's id is when its New audit page was opened: the history orders by the start."""
    db = tmp_path / "gnq.duckdb"
    _job(db, None, job_id="20231114-100000-aaaaaa", status="done", started=STARTED + 60,
         finished=STARTED + 90)
    _job(db, None, job_id="20231114-230000-bbbbbb", status="failed", started=STARTED,
         finished=STARTED + 30, returncode=1)
    assert [j.job_id for j in list_jobs(db)] == ["20231114-100000-aaaaaa", "20231114-230000-bbbbbb"]
    assert outcome(list_jobs(db)[0]) == "done, took 30 s"
    assert outcome(list_jobs(db)[1]) == ("failed after 30 s during step 1 of 2 (audit) (exit code 1): see "
                                         "its log")


@pytest.mark.parametrize("page", ["runs", "new_audit"])
def test_a_new_session_lists_the_running_job_with_cancel_and_cancels_it(page, tmp_path, monkeypatch, sleeper):
    """After a reload (a new session: nothing in its state) the running job is on the page with
    its Cancel, which stops it."""
    db = tmp_path / "gnq.duckdb"
    monkeypatch.setenv("GNQ_DB", str(db))
    _job(db, sleeper, started=time.time() - 5)
    at = app_page(page)
    assert not at.exception, [e.message for e in at.exception]
    shown = rendered(" ".join(m.value for m in at.markdown))
    assert re.search(r"\*\*r\*\* · running for \d+ s, step 1 of 2 \(audit\)", shown), shown
    cancel = next(b for b in at.button if b.label == "Cancel")
    cancel.click().run()
    assert not at.exception, [e.message for e in at.exception]
    job = _gone(db)  # the page (this process) reaps the stand-in, which could not write its outcome
    assert (job.status, job.returncode) == ("cancelled", -signal.SIGTERM)
    assert outcome(job).startswith("cancelled from the dashboard at ")


def test_the_store_typed_in_the_sidebar_survives_a_reload(tmp_path, monkeypatch):
    """The typed store goes into the address (?store=), so a reload or a new tab opens the same
    store, and its jobs, instead of the default one."""
    monkeypatch.setenv("GNQ_DB", str(tmp_path / "default" / "gnq.duckdb"))
    other = tmp_path / "other" / "gnq.duckdb"
    at = app_page("new_audit", db_path=str(other))
    assert not at.exception, [e.message for e in at.exception]
    assert at.query_params["store"] in (str(other), [str(other)])
    reloaded = AppTest.from_file(str(DASHBOARD / "views" / "new_audit.py"), default_timeout=120)
    reloaded.query_params["store"] = str(other)
    reloaded.run()
    assert not reloaded.exception, [e.message for e in reloaded.exception]
    assert reloaded.text_input(key="db_path").value == str(other)


def test_a_job_still_stopping_says_so_instead_of_offering_cancel_again(tmp_path, monkeypatch):
    """A job finishes its batch before it stops (minutes on a big model): the page says it is
    cancelling, in every session, rather than a Cancel that seems to do nothing."""
    db = tmp_path / "gnq.duckdb"
    monkeypatch.setenv("GNQ_DB", str(db))
    stubborn = _shell("trap '' TERM; echo ready; sleep 60")
    try:
        _job(db, stubborn, started=time.time())
        cancel_job(list_jobs(db)[0])
        at = app_page("new_audit")
        assert not at.exception, [e.message for e in at.exception]
        assert list_jobs(db)[0].alive() and not [b for b in at.button if b.label == "Cancel"]
        assert any("Cancelling" in c.value for c in at.caption)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(stubborn.pid, signal.SIGKILL)
        stubborn.wait()


def test_a_job_stopped_inside_an_import_reads_as_cancelled_not_failed(tmp_path):
    """A signal while the job imports torch ends it at once with exit code 130 (interrupts.py),
    before it can write 'cancelled': the history says cancelled all the same, never "failed"."""
    db = tmp_path / "gnq.duckdb"
    proc = _shell("trap 'exit 130' TERM; echo ready; sleep 60 & wait")
    _job(db, proc)
    os.killpg(proc.pid, signal.SIGTERM)  # from outside the dashboard: no Cancel pressed
    job = _gone(db)
    assert (job.status, job.returncode) == ("cancelled", 130)
    assert outcome(job).startswith("cancelled by a signal from outside the dashboard")


@pytest.mark.slow  # builds two checkpoints and runs the whole New audit page
def test_a_run_a_gnq_command_is_writing_is_not_started_again_from_the_page(tmp_path, monkeypatch):
    """A run that `gnq audit` in a terminal is writing (its row 'running', its process alive) is
    refused on New audit in one line naming the process, and no job starts."""
    from hostile.hostile_helpers import make_series
    from test_store import _run

    from gnq_core.jobs import jobs as jobs_module
    from gnq_core.results.store import Store

    db = tmp_path / "gnq.duckdb"
    monkeypatch.setenv("GNQ_DB", str(db))
    store = Store(db)
    run = _run(store, name="busy")
    store.set_status(run.run_id, "running")  # owned by this (live) process, as a terminal's gnq would be
    series = make_series(tmp_path / "series", 2, max_length=24)
    data = tmp_path / "texts.txt"
    data.write_text("\n".join(f"text number {i} of the form test" for i in range(8)) + "\n")
    started = []
    monkeypatch.setattr(jobs_module, "start_job", lambda *a, **kw: started.append(a))
    at = app_page("new_audit", ckpt_mode="Local path", ckpt_path=str(series), data_mode="Local path",
                  data_path_input=str(data), form_name="busy")
    next(b for b in at.button if b.label == "Start audit").click().run()
    assert not at.exception, [e.message for e in at.exception]
    assert not started
    said = [rendered(e.value) for e in at.error]
    assert any(f"Not started: run 'busy' is being written by a process outside the dashboard (pid "
               f"{os.getpid()}): stop it where it runs (Ctrl-C)" in e for e in said), said
