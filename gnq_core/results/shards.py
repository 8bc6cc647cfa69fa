"""Sharded results: every rank writes Parquet files, nobody waits on the database.

A shards folder (one training run)::

    SHARDS/run.json                                   the run's identity (rank 0, atomic rewrite)
    SHARDS/examples.parquet                           example_id, text, grp, n_tokens (rank 0)
    SHARDS/scores/rank-00001.steps-00000051-00000100.parquet
    SHARDS/batches/rank-00001.steps-00000051-00000100.parquet
    SHARDS/scores/.rank-00001.steps-00000051-00000100.parquet.sha256   each file's digest, beside it

Scores and batches shards have the store's columns (``store_writes.SHARD_COLUMNS``: all but run_id);
each rank writes one pair per step range, each file atomically (``gnq_core.common.atomic``), then its
sha256: a reader refuses a file whose bytes changed since (a folder from before the digests is
read as it was).
``gnq ingest SHARDS --db DB`` loads a folder into the DuckDB store in one transaction,
idempotently; ``ShardStore`` answers every ``Store`` query straight from the
files through DuckDB's Parquet reader (the dashboard can open a shards folder as a store).
A folder whose ranks have not all written the same step ranges (a job still running or one
that died) is refused with one line naming what is missing.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pyarrow.parquet as pq

from gnq_core.errors import one_line
from gnq_core.results.records import RunSpec
from gnq_core.results.shard_files import (  # the writing side, named here too for the readers' users
    EXAMPLES_FILE,
    FORMAT,
    RUN_FILE,
    TRACKING_FILE,
    ShardError,
    ShardWriter,
    digest_path,
    file_digest,
    new_shard_folder,
    write_run_file,
)
from gnq_core.results.store import Store, shard_view
from gnq_core.results.store_queries import Run
from gnq_core.results.store_schema import StoreError
from gnq_core.results.store_writes import SHARD_COLUMNS

__all__ = ["ShardError", "ShardSet", "ShardStore", "ShardWriter", "ingest", "is_shard_folder",
           "new_shard_folder", "open_store", "read_shards", "write_run_file"]

_NAME = re.compile(r"rank-(\d{5})\.steps-(\d{8})-(\d{8})\.parquet")
_RUN_FIELDS = ("name", "kind", "lam", "batch_size", "seed", "max_length", "model_path", "dataset_path",
               "dataset_hash", "n_examples", "code_version")


# ---------------------------------------------------------------------- reading
@dataclass
class ShardSet:
    root: Path
    meta: dict[str, Any]
    examples: pd.DataFrame
    points: pd.DataFrame  # point, label, kind, status, path, model_hash
    files: dict[str, list[str]]  # scores / batches -> Parquet files

    @property
    def run(self) -> RunSpec:
        try:
            return RunSpec(**self.meta["run"])
        except (TypeError, ValueError) as exc:
            raise ShardError(f"{self.root / RUN_FILE}: not a valid run description ({exc})") from None

    @property
    def status(self) -> str:
        return "done" if self.meta.get("status") == "done" else "running"


def read_shards(root: str | Path) -> ShardSet:
    """Validate a shards folder (run.json, file names, completeness, Parquet schemas)."""
    root = Path(root)
    if not root.is_dir():
        raise ShardError(f"{root}: no such shards folder")
    run_path = root / RUN_FILE
    try:
        meta = json.loads(run_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ShardError(f"{root}: not a shards folder ({RUN_FILE} is missing)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ShardError(f"{run_path}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(meta.get("run"), dict):
        raise ShardError(f"{run_path}: not a GNQ shards description (format {FORMAT!r} expected)")
    missing = [k for k in _RUN_FIELDS if k not in meta["run"]]
    if missing:
        raise ShardError(f"{run_path}: lacks {', '.join(missing)}")
    world = int(meta.get("world_size", 1))
    files = {table: _table_files(root, table, world) for table in SHARD_COLUMNS}
    scores_ranges, batches_ranges = ({k[1:] for k in files[t]} for t in SHARD_COLUMNS)
    if scores_ranges != batches_ranges:
        odd = sorted(scores_ranges ^ batches_ranges)[0]
        raise ShardError(f"{root}: incomplete: steps {odd[0]}-{odd[1]} have a scores or a batches shard "
                         "but not both")
    examples = _read_examples(root)
    # path / model_hash: the checkpoint a Trainer saved at that epoch's end, when it saved one
    points = pd.DataFrame(meta.get("points") or [], columns=["point", "label", "kind", "done", "path",
                                                              "model_hash"])
    seen = _points_in(files["scores"].values())
    extra = [p for p in seen if p not in set(points["point"])]
    points = pd.concat([points, pd.DataFrame({"point": extra, "label": [f"epoch-{p + 1}" for p in extra],
                                              "kind": "epoch", "done": False})], ignore_index=True)
    points["status"] = ["done" if d else "pending" for d in points["done"]]
    points = points.astype({"path": object, "model_hash": object})
    points = points.where(points.notna(), None)
    shards = ShardSet(root, meta, examples, points[["point", "label", "kind", "status", "path",
                                                    "model_hash"]],
                      {t: [str(files[t][k]) for k in sorted(files[t])] for t in files})
    shards.run  # noqa: B018 (refuses an invalid run description now)
    return shards


def _table_files(root: Path, table: str, world: int) -> dict[tuple[int, int, int], Path]:
    found: dict[tuple[int, int, int], Path] = {}
    folder = root / table
    for path in sorted(folder.glob("*.parquet")) if folder.is_dir() else []:
        m = _NAME.fullmatch(path.name)
        if m is None:
            raise ShardError(f"{path}: unexpected file name (rank-RRRRR.steps-AAAAAAAA-BBBBBBBB.parquet)")
        rank, first, last = (int(g) for g in m.groups())
        if rank >= world:
            raise ShardError(f"{path}: rank {rank}, but {RUN_FILE} says the run had {world} ranks")
        _check_schema(path, table)
        found[(rank, first, last)] = path
    ranges = {(a, b) for _, a, b in found}
    for first, last in sorted(ranges):
        absent = [r for r in range(world) if (r, first, last) not in found]
        if absent:
            raise ShardError(f"{root}: incomplete: rank {absent[0]} has no {table} shard for steps "
                             f"{first}-{last} (a rank still running, or one that failed)")
    return found


def _check_digest(path: Path) -> None:
    """Refuse a shard whose bytes are not those its writer recorded beside it (no record: a folder
    written before the digests, read as it was)."""
    record = digest_path(path)
    try:
        wanted = record.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ShardError(f"{record}: cannot be read ({exc.strerror or exc})") from None
    try:
        found = file_digest(path)
    except OSError as exc:
        raise ShardError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if found != wanted:
        raise ShardError(f"{path}: altered or cut short since it was written (its sha256 is not the one "
                         f"recorded in {record.name}); refused")


def _check_schema(path: Path, table: str) -> None:
    try:
        names = set(pq.read_schema(path).names)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise ShardError(f"{path}: not a readable Parquet file ({one_line(exc)})") from None
    _check_digest(path)  # readable, but are these the bytes written?
    lacking = [c for c in SHARD_COLUMNS[table] if c not in names]
    if lacking:
        raise ShardError(f"{path}: lacks the column(s) {', '.join(lacking)}")


def _read_examples(root: Path) -> pd.DataFrame:
    path = root / EXAMPLES_FILE
    if not path.exists():
        return pd.DataFrame(columns=["example_id", "text", "grp", "n_tokens"])
    try:
        frame = pd.read_parquet(path)
    except Exception as exc:
        raise ShardError(f"{path}: not a readable Parquet file ({one_line(exc)})") from None
    _check_digest(path)
    lacking = [c for c in ("example_id", "text", "grp", "n_tokens") if c not in frame.columns]
    if lacking:
        raise ShardError(f"{path}: lacks the column(s) {', '.join(lacking)}")
    return frame


def _points_in(paths) -> list[int]:
    points: set[int] = set()
    for path in paths:
        try:
            column = pq.read_table(path, columns=["point"]).column(0)
            points.update(int(p) for p in column.unique().to_pylist())
        except Exception as exc:
            raise ShardError(f"{path}: not a readable Parquet file ({one_line(exc)})") from None
    return sorted(points)


def ingest(store: Store, root: str | Path) -> tuple[Run, dict[str, int]]:
    """Load a shards folder into the store (one transaction; a rerun replaces, never duplicates)."""
    shards = read_shards(root)
    tracked = Path(root) / TRACKING_FILE  # secret values probed while training (integrations/tracking.py)
    try:
        tracking = pd.read_parquet(tracked) if tracked.is_file() else None
        run = store.import_run(shards.run, shards.examples, shards.points, shards.files["scores"],
                               shards.files["batches"], status=shards.status, tracking=tracking)
    except (duckdb.Error, OSError, ValueError) as exc:  # a Parquet file damaged past its footer
        raise ShardError(f"{shards.root}: cannot read the shards ({one_line(exc)})") from None
    return run, store.row_counts(run.run_id)


# ---------------------------------------------------------------------- querying without ingesting
class ShardStore(Store):
    """A read-only ``Store`` over a shards folder: the run is run 1; scores and batches are views
    over the Parquet files (DuckDB reads them at query time, nothing is copied)."""

    def __init__(self, root: str | Path) -> None:
        super().__init__(Path(root))
        self.shards = read_shards(root)

    @contextlib.contextmanager
    def connect(self, *, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        if not read_only:
            raise StoreError(f"{self.path}: a shards folder is read-only; load it into a store with "
                             f"`gnq ingest {self.path} --db FILE`")
        s = self.shards
        with shard_view(s.run, s.status, s.examples, s.points, s.files) as con:
            yield con

    def schema_version(self) -> int:
        return 0


def is_shard_folder(path: str | Path) -> bool:
    return (Path(path) / RUN_FILE).is_file()


def open_store(path: str | Path | None = None, **kwargs: Any) -> Store:
    """The store at ``path``: a DuckDB file, or a shards folder read in place (read-only)."""
    if path is not None and is_shard_folder(path):
        return ShardStore(path)
    return Store(path, **kwargs)
