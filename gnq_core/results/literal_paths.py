"""File paths handed to DuckDB as themselves: its file readers (``read_parquet`` …) treat ``*``,
``?`` and ``[…]`` in a path as a glob, so a folder named ``run[1]`` would read a sibling ``run1``.
Each such character is put in a one-character class, which matches only itself."""

from __future__ import annotations

import re
from pathlib import Path

_GLOB = re.compile(r"([\[*?])")


def duckdb_literal(path: str | Path) -> str:
    """``path`` as a DuckDB SQL string literal (quoted) that matches exactly that one file."""
    return "'" + _GLOB.sub(r"[\1]", str(path)).replace("'", "''") + "'"
