"""The terminal as a user meets it: `gnq runs` fits the terminal's width by leaving whole columns out
(never every header cut to "sta…"), and the CSV formula guard is counted so `gnq export` can say why
a cell begins with '.  The command end to end: tests/cli/test_cli.py."""

from __future__ import annotations

import io

import pandas as pd
from rich.console import Console
from rich.table import Table

from gnq_core.cli.results import RUN_COLUMNS, RUN_COLUMNS_DROPPED_FIRST, fit_columns
from gnq_core.results.export import FORMULA_GUARD, guarded_cells, neutralise_formulas

ROW = ["12", "demo-training", "train", "running", "451", "12/12", "0.01", "16", "0", "64", "451",
       "2026-11-28 00:01"]


def rendered(keep: list[int], width: int) -> list[str]:
    table = Table()
    for i in keep:
        table.add_column(RUN_COLUMNS[i], no_wrap=True)
    table.add_row(*(ROW[i] for i in keep))
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text().splitlines()


def test_every_column_is_kept_when_the_terminal_is_wide():
    assert fit_columns(RUN_COLUMNS, [ROW], 200, RUN_COLUMNS_DROPPED_FIRST) == list(range(len(RUN_COLUMNS)))


def test_at_80_columns_whole_columns_go_and_what_stays_is_not_cut():
    keep = fit_columns(RUN_COLUMNS, [ROW], 80, RUN_COLUMNS_DROPPED_FIRST)
    shown = [RUN_COLUMNS[i] for i in keep]
    assert {"id", "name", "status", "points", "updated"} <= set(shown) and len(shown) < len(RUN_COLUMNS)
    lines = rendered(keep, 80)
    assert max(len(line) for line in lines) <= 80 and not any("…" in line for line in lines)
    assert all(h in lines[1] for h in shown)  # headers whole, on one line
    assert "2026-11-28 00:01" in "\n".join(lines)
    # the computed width is rich's own: the table just fits, one column more would not
    more = sorted(keep + [RUN_COLUMNS.index(RUN_COLUMNS_DROPPED_FIRST[len(RUN_COLUMNS) - len(keep) - 1])])
    assert max(len(line) for line in rendered(more, 200)) > 80


def test_a_terminal_too_narrow_for_the_last_columns_keeps_them():
    keep = fit_columns(RUN_COLUMNS, [ROW], 20, RUN_COLUMNS_DROPPED_FIRST)
    assert [RUN_COLUMNS[i] for i in keep] == ["id", "name", "status", "points", "updated"]


def test_guarded_cells_counts_what_the_csv_guard_changes():
    frame = pd.DataFrame({"text": ["+351 912 345 678", "plain", "=1+1", None, "'quoted"],
                          "gnq": [1.0, float("nan"), 2.0, 3.0, 4.0],
                          "secret": ["phone", None, "", "x", "-1"]})
    assert guarded_cells(frame) == 4
    guarded = neutralise_formulas(frame)
    assert guarded.loc[0, "text"] == FORMULA_GUARD + "+351 912 345 678" and guarded.loc[1, "text"] == "plain"
    assert guarded_cells(frame[["gnq"]]) == 0
