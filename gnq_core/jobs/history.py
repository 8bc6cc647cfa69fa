"""A job's history line: what happened to one start, its outcome and the reason, in words (the
job panel of the Runs and New audit pages shows one per job, the latest first)."""

from __future__ import annotations

import signal
import time

from gnq_core.jobs.jobs import Job
from gnq_core.pipelines.estimate import duration

# A process killed by SIGKILL wrote nothing: the kernel's out-of-memory killer is the usual sender
# for a job that was running (the audit's memory grows with the batch size and max length).
_KILLED = {signal.SIGKILL: "killed by SIGKILL: the system's out-of-memory killer sends it when memory runs "
                           "out (a smaller batch size or max length needs less), or someone ran kill -9",
           signal.SIGTERM: "stopped by SIGTERM before it could record its outcome"}


def _step(job: Job) -> str:
    if not job.steps:
        return ""
    kinds = [str(s.get("kind", "?")) if isinstance(s, dict) else "?" for s in job.steps]
    here = f"step {job.step + 1} of {len(job.steps)} ({kinds[min(job.step, len(kinds) - 1)]})"
    finished = ", ".join(kinds[:job.step])
    return f" during {here}" + (f", after the {finished} finished" if finished else "")


def _clock(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(seconds))


def outcome(job: Job, now: float | None = None) -> str:
    """One line: the status, how long, where it stopped and why; e.g. "cancelled from the
    dashboard at 20:35:42, after 53 s during step 2 of 2 (extract), after the audit finished:
    what it finished is kept; starting it again resumes"."""
    took = duration((job.finished or now or time.time()) - job.started)
    if job.status in ("queued", "running"):
        return f"{job.status} for {took}" + (f", {_step(job).removeprefix(' during ')}" if job.steps else "")
    if job.status == "done":
        return f"done, took {took}"
    where = f"after {took}{_step(job)}"
    if job.status == "cancelled":
        asked = job.cancel_requested()
        who = (f"from the dashboard at {_clock(asked)}" if asked is not None
               else "by a signal from outside the dashboard (Ctrl-C or kill)")
        return f"cancelled {who}, {where}: what it finished is kept; starting it again resumes"
    if job.status == "failed":
        if error := job.error_line():
            return f"failed {where}: {error.removeprefix('error: ')}"
        code = job.returncode
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code)
            except ValueError:
                return f"failed {where}: killed by signal {-code}"
            return f"failed {where}: " + _KILLED.get(name, f"killed by {name.name}")
        if code is None:
            return (f"failed {where}: its process ended without recording an outcome (killed, e.g. by the "
                    "out-of-memory killer or kill -9, while no dashboard was watching it)")
        return f"failed {where} (exit code {code}): see its log"
    return f"{job.status} {where}"
