"""Paths are literal everywhere: a shards folder named with glob characters
(`[1]`, `*`, `?`) reads its own files, never a sibling's."""

from __future__ import annotations

import duckdb
import pandas as pd
import pytest

from gnq_core.results.literal_paths import duckdb_literal
from gnq_core.results.store_writes import shard_select


@pytest.mark.parametrize("name", ["run[1]", "run*", "run?", "ru[n]1", "it's[1]"])
def test_a_folder_named_like_a_pattern_reads_its_own_shards(tmp_path, name):
    mine, sibling = tmp_path / name / "scores", tmp_path / "run1" / "scores"
    for folder, gnq in ((mine, 1.0), (sibling, 99.0)):
        folder.mkdir(parents=True, exist_ok=True)
        pd.DataFrame({"point": [0], "example_id": [0], "step": [0], "batch_index": [0], "gnq": [gnq]}
                     ).to_parquet(folder / "rank-00000.parquet")
    con = duckdb.connect()
    rows = con.execute(shard_select("scores", [str(mine / "rank-00000.parquet")], 3)).fetchall()
    assert [(r[0], r[-1]) for r in rows] == [(3, 1.0)]  # its own score, one row, not the sibling's


def test_duckdb_literal_matches_only_itself(tmp_path):
    (tmp_path / "a[b]").mkdir()
    (tmp_path / "a[b]" / "f.txt").write_text("x\n")
    con = duckdb.connect()
    got = con.execute(f"SELECT file FROM glob({duckdb_literal(tmp_path / 'a[b]' / 'f.txt')})").fetchall()
    assert got == [(str(tmp_path / "a[b]" / "f.txt"),)]
