"""``gnq study``: deprecated.  The paper's studies are a program of their own, ``python -m research
study`` (research/cli.py), because research/ is not installed with gnq-audit.  For one release
``gnq study ARGS`` still works: it says so in one line on stderr and runs ``python -m research
study ARGS`` in this process.  This is the one place in gnq_core that names research (found by
name at run time, never imported: tests/project/test_layering.py)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import typer

from gnq_core.cli.command import app
from gnq_core.cli.usage_errors import fail

MOVED = ("DeprecationWarning: `gnq study` is now `python -m research study` (from a clone); this "
         "forwarder goes in the next release")


def research_program() -> ModuleType:
    """``research.cli``, from the research/ folder of the repository gnq_core runs from (a clone,
    an editable install) or of the current folder; one line and exit code 1 without one."""
    try:
        return importlib.import_module("research.cli")
    except ModuleNotFoundError as exc:
        if exc.name not in ("research", "research.cli"):
            raise
    for root in (Path(__file__).resolve().parents[2], Path.cwd()):
        if (root / "research" / "cli.py").is_file():
            sys.path.insert(0, str(root))
            sys.modules.pop("research", None)  # another package of that name, imported above
            return importlib.import_module("research.cli")
    fail("gnq study: the studies live in the repository's research/ folder, which an installed gnq-audit "
         "does not include; clone the repository and run python -m research study from it")


@app.command("study", add_help_option=False,  # --help too is the study program's
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             help="Deprecated: the paper's studies are now python -m research study (from a clone); "
                  "gnq study runs it with the same arguments, for one release.")
def study(ctx: typer.Context) -> None:
    """Say where the studies went, then run ``python -m research study`` on the same arguments."""
    typer.echo(MOVED, err=True)
    research_program().main(["study", *ctx.args], prog_name="gnq")
