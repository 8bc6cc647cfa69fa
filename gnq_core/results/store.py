"""The results store: one DuckDB file, its schema and migrations, and every query on it.

``Store`` is the one public class; this module owns its connections (opening, waiting for a
busy file, one-line errors), ``store_schema`` the migrations, ``store_queries`` the reads and
``store_writes`` the writes (mixins of ``Store``).  Every SQL statement is in these four.

Connections are short-lived: each operation opens the file, does its work in one transaction
and closes it.  DuckDB lets one process write at a time, so a long job holding the file open
would lock the dashboard out; with short connections a reader gets in between writes, and a
second writer waits (with a message) instead of failing with a lock error.

A checkpoint's (or an epoch's) results are written in a single transaction together with its
'done' mark, so an interrupted job leaves either all of a point or none of it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from gnq_core.errors import one_line
from gnq_core.results.store_queries import StoreQueries
from gnq_core.results.store_schema import (
    SCHEMA_VERSION,
    StoreError,
    apply_migrations,
    atomically,
    check_tables,
    current_version,
)
from gnq_core.results.store_writes import (
    POINT_COLUMNS,
    StoreWrites,
    insert_examples,
    insert_run,
    shard_select,
)

if TYPE_CHECKING:
    import pandas as pd

    from gnq_core.results.records import RunSpec

DEFAULT_DB = Path("data") / "gnq.duckdb"
WAIT_MESSAGE_EVERY = 300.0  # seconds between two "busy; waiting" messages of one Store
# DuckDB's errors for a failing file (disk full, read-only, out of memory; a failed commit comes as a
# TransactionException): shown as one line naming the store.  Others (a constraint broken) are bugs.
# What a store with a table dropped or a damaged file raises (the store owns all SQL, so these
# mean the file, not the query; a Binder error, a column a record has and the table lacks, stays
# the caller's to handle).
_DAMAGE_ERRORS = (duckdb.CatalogException, duckdb.SerializationException, duckdb.InternalException)
_IO_ERRORS = (duckdb.IOException, duckdb.TransactionException, duckdb.PermissionException,
              duckdb.OutOfMemoryException, duckdb.FatalException)


def default_db_path() -> Path:
    """``$GNQ_DB`` when set, else data/gnq.duckdb."""
    return Path(os.environ.get("GNQ_DB") or DEFAULT_DB)


class Store(StoreQueries, StoreWrites):
    """Owns the DuckDB file.  ``Store(path)`` creates and migrates it on first write."""

    def __init__(self, path: str | Path | None = None, *, busy_timeout: float | None = None,
                 on_wait: Callable[[str], None] | None = None) -> None:
        self.path = Path(path) if path is not None else default_db_path()
        # How long to wait for another process's write: ``$GNQ_BUSY_TIMEOUT`` seconds, else 120.
        self.busy_timeout = busy_timeout if busy_timeout is not None else float(
            os.environ.get("GNQ_BUSY_TIMEOUT") or 120.0)
        self.on_wait = on_wait
        self._ready = False
        self._told = -WAIT_MESSAGE_EVERY  # when on_wait was last called (monotonic seconds)

    # ----------------------------------------------------------------- connections
    @contextlib.contextmanager
    def connect(self, *, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A short-lived connection; waits while another process is writing."""
        if not read_only:
            self._ensure_schema()
        elif not self.path.exists():
            # Nothing written yet: read from an empty in-memory store with the same schema.
            con = duckdb.connect(":memory:")
            try:
                apply_migrations(con, 0)
                yield con
            finally:
                con.close()
            return
        con = self._open(read_only)
        if read_only and not self._ready:
            # Refuse foreign or newer files on reads too; an older store is migrated first, so
            # every query sees the current schema.
            if current_version(con, self.path) < SCHEMA_VERSION:
                con.close()
                self._ensure_schema()
                con = self._open(read_only)
            else:
                self._ready = True
        try:
            yield con
        except duckdb.InterruptException:  # DuckDB's form of a Ctrl-C/SIGTERM mid-query: an interrupt
            raise KeyboardInterrupt from None
        except _IO_ERRORS as exc:  # disk full, read-only folder, ...: one line naming the file
            raise StoreError(f"{self.path}: {'cannot read' if read_only else 'cannot write'} the store "
                             f"({one_line(exc)})") from None
        except _DAMAGE_ERRORS as exc:  # a table or column missing, a damaged file: one line too
            raise StoreError(f"{self.path}: damaged, or not a store gnq made ({one_line(exc)})") from None
        finally:
            con.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A write connection inside BEGIN/COMMIT; rolled back on any exception."""
        with self.connect() as con, atomically(con):
            yield con

    def _open(self, read_only: bool) -> duckdb.DuckDBPyConnection:
        if self.path.exists() and not self.path.is_file():  # a folder, FIFO or device: never write into it
            raise StoreError(f"{self.path}: not a store file (a folder, device, FIFO or socket); refused")
        deadline = time.monotonic() + self.busy_timeout
        delay = 0.05
        while True:
            try:
                return duckdb.connect(str(self.path), read_only=read_only)
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower():
                    raise StoreError(f"{self.path}: cannot open the store ({one_line(exc)})") from None
                if time.monotonic() > deadline:
                    raise StoreError(f"{self.path}: another process has held the store for more than "
                                     f"{self.busy_timeout:g} s; try again when it has finished") from None
                if self.on_wait is not None and time.monotonic() - self._told > WAIT_MESSAGE_EVERY:
                    # once, not at every short write of a job that commits batch by batch
                    self.on_wait(f"{self.path} is busy (another gnq job is writing); waiting...")
                    self._told = time.monotonic()
                time.sleep(delay)
                delay = min(delay * 1.5, 1.0)
            except duckdb.Error as exc:
                raise StoreError(f"{self.path}: not a GNQ store ({one_line(exc)})") from None
            except RuntimeError as exc:  # duckdb raises some file errors as plain RuntimeError
                raise StoreError(f"{self.path}: cannot open the store ({one_line(exc)})") from None

    def _ensure_schema(self) -> None:
        if self._ready:
            return
        if self.path.is_dir():
            raise StoreError(f"{self.path}: is a folder, not a DuckDB file")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot create its folder ({exc.strerror or exc})") from None
        con = self._open(read_only=False)
        try:
            version = current_version(con, self.path)
            if version < SCHEMA_VERSION:
                check_tables(con, self.path, version)
                apply_migrations(con, version)
        except _IO_ERRORS as exc:
            raise StoreError(f"{self.path}: cannot write the store ({one_line(exc)})") from None
        except duckdb.Error as exc:  # a damaged older store: the one transaction was rolled back
            raise StoreError(f"{self.path}: cannot migrate this store to schema {SCHEMA_VERSION} "
                             f"({one_line(exc)}); left as it was") from None
        finally:
            con.close()
        self._ready = True

    def row_counts(self, run_id: int) -> dict[str, int]:
        """Rows of the run in scores, batches and points."""
        with self.connect(read_only=True) as con:
            return {t: con.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?", [run_id]).fetchone()[0]
                    for t in ("scores", "batches", "points")}

    def require_existing(self) -> Store:
        """This store, refused in one line when its file does not exist: reading commands and pages
        never create one (a typo in the path would otherwise look like a new, empty store)."""
        if not self.path.exists():
            raise StoreError(f"{self.path}: no such store (check the path; gnq train, audit, demo and "
                             "ingest create one)")
        return self

    def schema_version(self) -> int:
        if not self.path.exists():
            return 0
        with self.connect(read_only=True) as con:
            return current_version(con, self.path)


@contextlib.contextmanager
def shard_view(spec: RunSpec, status: str, examples: pd.DataFrame, points: pd.DataFrame,
               files: dict[str, list[str]]) -> Iterator[duckdb.DuckDBPyConnection]:
    """For ``results/shards.py`` (which runs no SQL of its own): an in-memory store holding one
    run (run 1) whose scores and batches are views over its Parquet shards (DuckDB reads them at
    query time, nothing is copied).  ``points``: point,
    label, kind, status; ``files``: scores / batches -> Parquet files."""
    con = duckdb.connect(":memory:")
    try:
        apply_migrations(con, 0)
        run_id = insert_run(con, spec)
        con.execute("UPDATE runs SET status = ? WHERE run_id = ?", [status, run_id])
        insert_examples(con, run_id, examples)
        con.register("shard_points", points.reindex(columns=POINT_COLUMNS).assign(run_id=run_id)[
            ["run_id", *POINT_COLUMNS]])
        con.execute(f"INSERT INTO points (run_id, {', '.join(POINT_COLUMNS)}) SELECT * FROM shard_points")
        for table, paths in files.items():
            if paths:  # a table without shards yet stays the schema's empty table
                con.execute(f"DROP TABLE {table}")
                con.execute(f"CREATE VIEW {table} AS {shard_select(table, paths, run_id)}")
        yield con
    finally:
        con.close()
