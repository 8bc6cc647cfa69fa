"""`gnq` called in this process for tests that need it to succeed."""

from __future__ import annotations

from typer.testing import CliRunner

from gnq_core.cli import app


def gnq(*args: object) -> str:
    """`gnq ARGS` in this process (typer's runner); must succeed; its output."""
    result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output
