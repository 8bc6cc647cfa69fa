"""An option value the command line refuses (``--top -5``, ``--port 0``) is one line on stderr and
exit code 1, as every other bad input is; not click's usage box and exit code 2.  Other usage
errors (a missing or unknown option) keep click's help.  A Ctrl-C outside a command's own handling
(while options are parsed, or in ``gnq selfcheck``) is one line and exit code 130, not typer's
silent exit."""

from __future__ import annotations

from typing import Any, NoReturn

import typer
from rich.console import Console
from typer.core import TyperGroup

from gnq_core.common.terminal import markup_safe


def fail(line: str) -> NoReturn:
    """``error: LINE`` on stderr and exit code 1 (the ``gnq`` commands' one line)."""
    Console(stderr=True).print(f"[red]error:[/] {markup_safe(line)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=1) from None


class OneLineValueErrors(TyperGroup):
    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)  # parses the subcommand's options, then runs it
        except typer.BadParameter as exc:
            fail(exc.format_message())
        except KeyboardInterrupt:
            Console(stderr=True).print("interrupted", highlight=False, markup=False)
            raise typer.Exit(code=130) from None
