"""Whether a 'running' run's process still exists (on this host: its pid, not a zombie; on
another host sharing the store: a recent heartbeat), so the store shows a run whose job died as
'interrupted' instead of running forever."""

from __future__ import annotations

import os
import socket
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

HEARTBEAT_STALE = 900.0  # seconds without a report after which another host's job counts as gone


def run_is_alive(pid: Any, host: Any, heartbeat_at: Any, *, now: datetime | None = None) -> bool:
    """Whether the process that owns a 'running' run still exists.  On this host: its pid exists
    and is not a zombie.  On another host (a shared store): it reported within ``$GNQ_HEARTBEAT_STALE``
    seconds (default 900).  A run written before host was recorded is checked as local."""
    if host is not None and not pd.isna(host) and host != socket.gethostname():
        if heartbeat_at is None or pd.isna(heartbeat_at):
            return True  # nothing to judge by; never call another machine's job dead on a guess
        stale = float(os.environ.get("GNQ_HEARTBEAT_STALE") or HEARTBEAT_STALE)
        return ((now or datetime.now()) - pd.Timestamp(heartbeat_at).to_pydatetime()).total_seconds() < stale
    if pid is None or pd.isna(pid):
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # exists, owned by someone else
    try:  # a dead child not yet reaped by its parent (the dashboard) still has a pid: a zombie
        return Path(f"/proc/{int(pid)}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def with_liveness(rows: pd.DataFrame) -> pd.DataFrame:
    """'running' rows whose process is gone become 'interrupted', with a message saying so."""
    if rows.empty:
        return rows
    rows = rows.copy()
    for i, r in rows[rows["status"] == "running"].iterrows():
        if not run_is_alive(r.get("pid"), r.get("host"), r.get("heartbeat_at")):
            rows.at[i, "status"] = "interrupted"
            where = f" on {r['host']}" if isinstance(r.get("host"), str) else ""
            rows.at[i, "message"] = (f"its process (pid {int(r['pid'])}{where}) is gone; rerun the same "
                                     "command to resume")
    return rows
