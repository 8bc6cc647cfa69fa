"""The ``gnq`` console script: a Ctrl-C while Python imports the command line (typer, rich, then
torch) is one line and exit code 130, never a traceback, so the interrupt guard is installed before
anything heavy is imported (``interrupts.guard_startup``); the command's own handling replaces it.

The command is part of the dashboard install (``gnq-audit[dashboard]``): on the library alone it
says so in one line instead of failing on its first missing import."""

from __future__ import annotations

import importlib.util
import sys

from gnq_core.common import interrupts

# what the command line imports beyond the library: typer/rich for the command, duckdb for the store
COMMAND_NEEDS = ("typer", "rich", "duckdb")


def missing_extra() -> str | None:
    """One line naming the extra to install, or None when the command can run."""
    missing = [name for name in COMMAND_NEEDS if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return (f"gnq: the gnq command needs the dashboard extra ({', '.join(missing)} not installed): "
            "pip install 'gnq-audit[dashboard]'")


def main() -> None:
    interrupts.guard_startup()
    if (line := missing_extra()) is not None:
        print(line, file=sys.stderr)
        sys.exit(1)
    from gnq_core.cli import app

    app()
