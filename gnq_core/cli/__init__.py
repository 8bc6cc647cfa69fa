"""The ``gnq`` command: train with in-run GNQ, audit checkpoints, attack, export, list runs, demo.

Every command reads and writes one DuckDB store (``--db``, else ``$GNQ_DB``, else
data/gnq.duckdb).  User mistakes (a bad file, an unknown run, a busy store) end with one line
on stderr and exit code 1, never a traceback.  The commands only parse options: ``command`` holds
the Typer app, the shared options and the one-line error handling; ``running`` the job commands
(train, audit, extract, demo, job); ``results`` export, report, runs, ingest; ``acting``
remediate, compare; ``tools`` dashboard, selfcheck, model; ``studies`` the deprecated ``gnq study``,
which forwards to ``python -m research study``.
"""

from __future__ import annotations

from gnq_core.cli import acting, results, running, studies, tools  # noqa: F401  (registers the commands)
from gnq_core.cli.command import app

# `gnq --help` lists the commands in the order a user meets them, not the modules' import order.
ORDER = ("train", "estimate", "audit", "extract", "export", "report", "remediate", "compare", "dashboard",
         "runs", "demo", "job", "ingest", "selfcheck", "study")
app.registered_commands.sort(key=lambda c: ORDER.index(c.callback.__name__))

__all__ = ["app"]
