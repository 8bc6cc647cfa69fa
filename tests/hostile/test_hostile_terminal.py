"""Terminal escape sequences: a string from an untrusted file or a user (a CSV
header, a checkpoint folder's name, a run name) never reaches the terminal raw: not in the one-line
errors, the progress bar, `gnq runs`, nor as rich markup."""

from __future__ import annotations

import pytest
from hostile_helpers import make_series, write_texts_csv
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.common.progress import Reporter
from gnq_core.common.terminal import markup_safe, terminal_safe

# window title, clear screen, clipboard write, BEL, C1 CSI, right-to-left override, rich markup
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b]52;c;aGk=\x07\x9b31m\u202eevil[bold red]x"
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


def _clean(output: str) -> None:
    for char in RAW:
        assert char not in output, repr(output)


@pytest.mark.parametrize("char", [*RAW, "\x00", "\x7f", "\x85", "\u2066", "\u200f", "\u2028", "\r", "\n"])
def test_every_control_is_made_visible(char):
    shown = terminal_safe(f"a{char}b")
    assert char not in shown and shown.startswith("a\\") and shown.endswith("b")
    assert terminal_safe("héllo, 日本 ✓") == "héllo, 日本 ✓"
    assert markup_safe("[bold]x") == "\\[bold]x"


@pytest.mark.slow
def test_the_one_line_error_escapes_a_csv_header(tmp_path):
    data = tmp_path / "texts.csv"
    data.write_text(f"{HOSTILE}\nhello\n", encoding="utf-8")
    series = make_series(tmp_path / "series", 1, max_length=16)
    result = CliRunner().invoke(app, ["audit", "--checkpoints", str(series), "--data", str(data),
                                      "--text-column", "text", "--db", str(tmp_path / "gnq.duckdb")])
    assert result.exit_code == 1
    _clean(result.output)
    assert "\\x1b]0;pwned" in result.output and "[bold red]" in result.output  # shown, not acted on


@pytest.mark.slow
def test_progress_bar_and_runs_escape_a_folder_name(tmp_path, capsys):
    series = make_series(tmp_path / "series", 1, max_length=16)
    hostile = tmp_path / HOSTILE.replace("/", "_")
    series.rename(hostile)
    data = write_texts_csv(tmp_path / "texts.csv", 8)
    db = str(tmp_path / "gnq.duckdb")
    result = CliRunner().invoke(app, ["audit", "--checkpoints", str(hostile), "--data", str(data), "--db", db,
                                      "--batch-size", "4", "--max-length", "16"])
    assert result.exit_code == 0, result.output
    _clean(result.output)
    runs = CliRunner().invoke(app, ["runs", "--db", db])
    assert runs.exit_code == 0
    _clean(runs.output)
    assert "\\x1b" in runs.output  # the name is shown, escaped


def test_reporter_labels_and_logs_are_safe(capsys):
    with Reporter(quiet=False) as reporter:
        reporter.stage(HOSTILE, 2)
        reporter.advance(2)
        reporter.log(f"resuming run {HOSTILE!s}")
    out = capsys.readouterr()
    _clean(out.out + out.err)
