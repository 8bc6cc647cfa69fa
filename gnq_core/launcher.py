"""The ``gnq`` console script: a Ctrl-C while Python imports the command line (typer, rich, then
torch) is one line and exit code 130, never a traceback, so the interrupt guard is installed before
anything heavy is imported (``interrupts.guard_startup``); the command's own handling replaces it."""

from __future__ import annotations

from gnq_core import interrupts


def main() -> None:
    interrupts.guard_startup()
    from gnq_core.cli import app

    app()
