"""The results store: one DuckDB file, its schema and migrations, and every query on it.

Connections are short-lived: each operation opens the file, does its work in one transaction
and closes it.  DuckDB lets one process write at a time, so a long job holding the file open
would lock the dashboard out; with short connections a reader gets in between writes, and a
second writer waits (with a message) instead of failing with a lock error.

A checkpoint's (or an epoch's) results are written in a single transaction together with its
'done' mark, so an interrupted job leaves either all of a point or none of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd

from gnq_core.engine.losses import TOKEN_MEAN, TOKEN_SUM
from gnq_core.errors import GNQError
from gnq_core.errors import one_line as first_line
from gnq_core.results.literal_paths import duckdb_literal
from gnq_core.results.liveness import run_is_alive, with_liveness  # noqa: F401 (run_is_alive: re-exported)
from gnq_core.results.records import (
    BATCH_COLUMNS,
    SCORE_COLUMNS,
    BatchResult,
    RunSpec,
    ScoreColumns,
    TextResult,
    batch_frame,
    resume_mismatches,
    score_frames,
)

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
DEFAULT_DB = Path("data") / "gnq.duckdb"
# The runs table's loss_convention column: the engine's conventions (engine/losses.py) in words.
LOSS_IN_WORDS = {TOKEN_MEAN: "per-example mean next-token NLL over the example's own tokens",
                 TOKEN_SUM: "per-example summed next-token NLL over the example's own tokens"}
WAIT_MESSAGE_EVERY = 300.0  # seconds between two "busy; waiting" messages of one Store
# DuckDB's errors for a failing file (disk full, read-only, out of memory; a failed commit comes as a
# TransactionException): shown as one line naming the store.  Others (a constraint broken) are bugs.
# What a store with a table dropped or a damaged file raises (the store owns all SQL, so these
# mean the file, not the query; a Binder error, a column a record has and the table lacks, stays
# the caller's to handle).
_DAMAGE_ERRORS = (duckdb.CatalogException, duckdb.SerializationException, duckdb.InternalException)
_IO_ERRORS = (duckdb.IOException, duckdb.TransactionException, duckdb.PermissionException,
              duckdb.OutOfMemoryException, duckdb.FatalException)


_CALIBRATION_COLUMNS = ["suffix_tokens", "reference_match", "reference_generated"]


class StoreError(GNQError, RuntimeError):
    """The store cannot be used (not a DuckDB file, newer schema, busy for too long...)."""


class RunNotFoundError(StoreError):
    pass


def default_db_path() -> Path:
    """``$GNQ_DB`` when set, else data/gnq.duckdb."""
    return Path(os.environ.get("GNQ_DB") or DEFAULT_DB)


def migrations() -> list[tuple[int, Path]]:
    """(version, file) for every migration, in order; the version is the file's number."""
    found = []
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        found.append((int(path.name.split("_", 1)[0]), path))
    return found


SCHEMA_VERSION = migrations()[-1][0]


def _now() -> datetime:
    return datetime.now().replace(microsecond=0)


@dataclass(frozen=True, kw_only=True)
class Run(RunSpec):
    """A stored run: its description, id and status."""

    run_id: int
    status: str

    def __post_init__(self) -> None:
        pass  # stored as it was: an old run is read even if today's rules would refuse it

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Run:
        settings = row.get("settings")
        names = {f.name for f in fields(cls)} - {"settings"}
        values = {k: None if pd.isna(v) else getattr(v, "item", lambda v=v: v)()  # numpy -> Python
                  for k, v in row.items() if k in names}
        return cls(**values, settings=json.loads(settings) if isinstance(settings, str) else (settings or {}))


class Store:
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
                _apply_migrations(con, 0)
                yield con
            finally:
                con.close()
            return
        con = self._open(read_only)
        if read_only and not self._ready:
            # Refuse foreign or newer files on reads too; an older store is migrated first, so
            # every query sees the current schema.
            if _current_version(con, self.path) < SCHEMA_VERSION:
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
                             f"({first_line(exc)})") from None
        except _DAMAGE_ERRORS as exc:  # a table or column missing, a damaged file: one line too
            raise StoreError(f"{self.path}: damaged, or not a store gnq made ({first_line(exc)})") from None
        finally:
            con.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A write connection inside BEGIN/COMMIT; rolled back on any exception."""
        with self.connect() as con, _atomically(con):
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
                    raise StoreError(f"{self.path}: cannot open the store ({first_line(exc)})") from None
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
                raise StoreError(f"{self.path}: not a GNQ store ({first_line(exc)})") from None
            except RuntimeError as exc:  # duckdb raises some file errors as plain RuntimeError
                raise StoreError(f"{self.path}: cannot open the store ({first_line(exc)})") from None

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
            _apply_migrations(con, _current_version(con, self.path))
        except _IO_ERRORS as exc:
            raise StoreError(f"{self.path}: cannot write the store ({first_line(exc)})") from None
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
            return _current_version(con, self.path)

    # ----------------------------------------------------------------- writing
    def create_run(self, spec: RunSpec, examples: pd.DataFrame | None = None) -> Run:
        """Insert a run and its examples (columns example_id, text, grp, n_tokens) in one transaction."""
        with self.transaction() as con:
            if con.execute("SELECT 1 FROM runs WHERE name = ?", [spec.name]).fetchone():
                raise StoreError(f"{self.path}: a run named {spec.name!r} already exists")
            run_id = _insert_run(con, spec)
            _insert_examples(con, run_id, examples)
        return self.run(run_id)

    def resumable_run(self, spec: RunSpec) -> Run | None:
        """The run named ``spec.name`` if there is one, refused unless it was made with the same
        kind, data and settings (a rerun resumes it); None when there is none yet."""
        run = self.find_run(spec.name)
        if run is None:
            return None
        if run.kind != spec.kind:
            raise StoreError(f"{self.path}: run {run.name!r} is a {run.kind} run, not {spec.kind}; "
                             "pick another --name")
        mismatches = resume_mismatches(run, spec)
        if mismatches:
            raise StoreError(f"{self.path}: run {run.name!r} exists with a different "
                             f"{', '.join(mismatches)}; use another --name to start a new run")
        return run

    def import_run(self, spec: RunSpec, examples: pd.DataFrame, points: pd.DataFrame,
                   score_files: Sequence[str], batch_files: Sequence[str], *, status: str) -> Run:
        """A run written elsewhere as Parquet shards (gnq_core.results.shards), in one transaction.

        ``spec``: the run, whose ``settings['shard_id']`` names the
        shards; a rerun on the same shards replaces the run's examples, points, scores and
        batches (idempotent; its id and extraction attacks are kept).  ``points``: point, label,
        kind, status.  Scores and batches are read by DuckDB straight from the files.
        """
        shard_id = spec.settings.get("shard_id")
        with self.transaction() as con:
            row = con.execute("SELECT run_id, settings FROM runs WHERE name = ?", [spec.name]).fetchone()
            if row is None:
                run_id = _insert_run(con, spec)
            else:
                run_id, settings = row
                if not shard_id or json.loads(settings or "{}").get("shard_id") != shard_id:
                    raise StoreError(f"{self.path}: a run named {spec.name!r} already exists and was "
                                     "not ingested from these shards")
                for table in ("examples", "points", "scores", "batches"):
                    con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
            _insert_examples(con, run_id, examples)
            frame = points.assign(run_id=run_id)[["run_id", "point", "label", "kind", "status"]]
            con.register("new_points", frame)
            con.execute("INSERT INTO points (run_id, point, label, kind, status) SELECT * FROM new_points")
            con.unregister("new_points")
            if score_files:
                con.execute(f"INSERT INTO scores BY NAME {shard_select('scores', score_files, run_id)}")
            if batch_files:
                con.execute(f"INSERT INTO batches BY NAME {shard_select('batches', batch_files, run_id)}")
            con.execute("UPDATE runs SET status = ?, updated_at = ?, settings = ? WHERE run_id = ?",
                        [status, _now(), json.dumps(spec.settings), run_id])
        return self.run(run_id)

    def set_status(self, run: int | str, status: str, message: str | None = None) -> None:
        """The run's status; 'running' also records this process as its owner (see liveness)."""
        run_id = self.run(run).run_id
        with self.transaction() as con:
            con.execute("""UPDATE runs SET status = ?, message = ?, updated_at = ?, pid = ?, host = ?,
                           heartbeat_at = ? WHERE run_id = ?""",
                        [status, message, _now(), os.getpid(), socket.gethostname(), _now(), run_id])

    @contextlib.contextmanager
    def tracking(self, run_id: int) -> Iterator[None]:
        """Mark the run 'done' when the block finishes, 'cancelled' on Ctrl-C/SIGTERM (finished
        points are kept, a rerun resumes), 'failed' with the error's first line otherwise."""
        try:
            yield
        except KeyboardInterrupt:
            self._mark(run_id, "cancelled", "interrupted; rerun the same command to resume")
            raise
        except Exception as exc:
            self._mark(run_id, "failed", first_line(exc))
            raise
        self.set_status(run_id, "done")

    def _mark(self, run_id: int, status: str, message: str) -> None:
        """The final status of a failed run, if the store can still be written: on a full disk it
        cannot, and the run then shows as interrupted (its process is gone) instead of a second error."""
        with contextlib.suppress(StoreError):
            self.set_status(run_id, status, message)

    def set_progress(self, run_id: int, done: int, total: int, note: str | None = None) -> None:
        with self.transaction() as con:
            con.execute("""UPDATE runs SET progress_done = ?, progress_total = ?, progress_note = ?,
                           updated_at = ?, pid = ?, host = ?, heartbeat_at = ? WHERE run_id = ?""",
                        [done, total, note, _now(), os.getpid(), socket.gethostname(), _now(), run_id])

    def add_points(self, run_id: int, points: Sequence[dict[str, Any]]) -> None:
        """Register trajectory points (label, kind, path, model_hash) as pending; existing ones are kept."""
        with self.transaction() as con:
            for p in points:
                con.execute("""INSERT INTO points (run_id, point, label, kind, path, model_hash, status)
                               VALUES (?, ?, ?, ?, ?, ?, 'pending') ON CONFLICT DO NOTHING""",
                            [run_id, p["point"], p["label"], p["kind"], p.get("path"), p.get("model_hash")])

    def write_point(self, run_id: int, point: int, texts: Sequence[TextResult] | ScoreColumns,
                    batches: Sequence[BatchResult], seconds: float, *, path: str | None = None,
                    model_hash: str | None = None) -> None:
        """All of one point's rows and its 'done' mark, atomically (a rerun replaces, never duplicates)."""
        with self.transaction() as con:
            for table in ("scores", "batches"):
                con.execute(f"DELETE FROM {table} WHERE run_id = ? AND point = ?", [run_id, point])
            for frame in score_frames(texts, point):  # ScoreColumns: in chunks, never one frame of all
                con.register("new_scores", frame.assign(run_id=run_id))
                con.execute("INSERT INTO scores BY NAME SELECT * FROM new_scores")
                con.unregister("new_scores")
            con.register("new_batches", batch_frame(batches, point).assign(run_id=run_id))
            con.execute("INSERT INTO batches BY NAME SELECT * FROM new_batches")
            con.execute("""UPDATE points SET status = 'done', seconds = ?, finished_at = ?,
                           path = coalesce(?, path), model_hash = coalesce(?, model_hash)
                           WHERE run_id = ? AND point = ?""",
                        [seconds, _now(), path, model_hash, run_id, point])
            # The run's model: for an audit (or a training from scratch) the latest checkpoint's
            # weights; a fine-tune keeps its base model's hash.
            con.execute("""UPDATE runs SET updated_at = ?, model_hash = CASE
                               WHEN kind = 'audit' OR json_extract_string(settings, '$.init') IS NULL
                               THEN coalesce(?, model_hash) ELSE model_hash END
                           WHERE run_id = ?""", [_now(), model_hash, run_id])

    def set_point_paths(self, run_id: int, paths: dict[int, str | None]) -> None:
        """Where points' checkpoint folders are now (None: deleted), in one transaction."""
        with self.transaction() as con:
            for point, path in paths.items():
                con.execute("UPDATE points SET path = ? WHERE run_id = ? AND point = ?",
                            [path, run_id, point])

    def set_run_paths(self, run_id: int, *, model_path: str | None = None,
                      dataset_path: str | None = None) -> None:
        """Where the run's model and dataset are now (None: unchanged): the kept copies of uploads."""
        with self.transaction() as con:
            con.execute("""UPDATE runs SET model_path = coalesce(?, model_path),
                           dataset_path = coalesce(?, dataset_path) WHERE run_id = ?""",
                        [model_path, dataset_path, run_id])

    def write_extractions(self, run_id: int, point: int, prefix_tokens: int, rows: pd.DataFrame,
                          code_version: str) -> None:
        """Attack results for some examples (replacing those examples' earlier rows with the same
        prefix length), in one transaction: an attack is committed batch by batch."""
        with self.transaction() as con:
            frame = rows.assign(run_id=run_id, point=point, prefix_tokens=prefix_tokens,
                                code_version=code_version, created_at=_now())
            for column in _CALIBRATION_COLUMNS:  # absent: an uncalibrated attack over the rest of the text
                if column not in frame.columns:
                    frame[column] = None
            frame = frame[["run_id", "point", "example_id", "prefix_tokens", "threshold", "n_continuation",
                           "match_fraction", "success", "prefix_text", "generated_text", "target_text",
                           "code_version", "created_at", "target_tokens", "generated_tokens",
                           *_CALIBRATION_COLUMNS]]
            frame = frame.astype({"suffix_tokens": "Int64", "reference_match": "Float64"})
            con.register("new_extractions", frame)
            con.execute("""DELETE FROM extractions WHERE run_id = ? AND point = ? AND prefix_tokens = ?
                           AND example_id IN (SELECT example_id FROM new_extractions)""",
                        [run_id, point, prefix_tokens])
            con.execute("INSERT INTO extractions SELECT * FROM new_extractions")

    def write_secret_attacks(self, run_id: int, point: int, rows: pd.DataFrame, code_version: str) -> None:
        """The secret-targeted attack's rows (pipelines/secret_attack.py) at one point, replacing
        the run's earlier ones (the latest attack is the one shown), in one transaction."""
        frame = rows[SECRET_ATTACK_COLUMNS].assign(run_id=run_id, point=point, code_version=code_version,
                                                   created_at=_now())
        with self.transaction() as con:
            con.execute("DELETE FROM secret_attacks WHERE run_id = ?", [run_id])
            con.register("new_secret_attacks", frame)
            con.execute("INSERT INTO secret_attacks BY NAME SELECT * FROM new_secret_attacks")
            con.unregister("new_secret_attacks")

    def secret_attacks(self, run_id: int) -> pd.DataFrame:
        return self._rows_of("secret_attacks", run_id, None, "example_id, secret_start")

    def delete_extractions(self, run_id: int, point: int, prefix_tokens: int) -> None:
        with self.transaction() as con:
            con.execute("DELETE FROM extractions WHERE run_id = ? AND point = ? AND prefix_tokens = ?",
                        [run_id, point, prefix_tokens])

    def attacked_examples(self, run_id: int, point: int, prefix_tokens: int,
                          threshold: float) -> set[int] | None:
        """Examples with a stored attack at this point and prefix length; None when some were
        attacked with another threshold (the stored attack cannot be resumed, only replaced)."""
        rows = self._query("SELECT example_id, threshold FROM extractions WHERE run_id = ? AND point = ? "
                           "AND prefix_tokens = ?", [run_id, point, prefix_tokens])
        if (rows["threshold"] != threshold).any():
            return None
        return set(rows["example_id"].astype(int))

    def write_metric(self, run_id: int, metric: str, values: pd.DataFrame,
                     settings: dict[str, Any] | None = None) -> None:
        """One per-example metric (columns example_id, value), replacing that metric's earlier rows."""
        with self.transaction() as con:
            con.execute("DELETE FROM example_metrics WHERE run_id = ? AND metric = ?", [run_id, metric])
            frame = values.assign(run_id=run_id, metric=metric, settings=json.dumps(settings or {}),
                                  created_at=_now())[
                ["run_id", "example_id", "metric", "value", "settings", "created_at"]]
            con.register("new_metrics", frame)
            con.execute("INSERT INTO example_metrics SELECT * FROM new_metrics")

    def write_text_labels(self, run_id: int, labels: pd.DataFrame) -> None:
        """Copies and secret labels of a run's texts (columns example_id + TEXT_LABEL_COLUMNS)."""
        frame = labels[["example_id", *TEXT_LABEL_COLUMNS]].astype(
            {"copies": "Int64", "cluster_id": "Int64", "secret_start": "Int64", "secret_end": "Int64"})
        with self.transaction() as con:
            con.register("new_labels", frame)
            sets = ", ".join(f"{c} = n.{c}" for c in TEXT_LABEL_COLUMNS)
            con.execute(f"""UPDATE examples SET {sets} FROM new_labels n
                            WHERE examples.run_id = ? AND examples.example_id = n.example_id""", [run_id])
            con.unregister("new_labels")

    def update_settings(self, run_id: int, entries: dict[str, Any]) -> None:
        """Add or replace top-level entries of a run's settings (its provenance), e.g. the attack rule."""
        with self.transaction() as con:
            row = con.execute("SELECT settings FROM runs WHERE run_id = ?", [run_id]).fetchone()
            if row is None:
                raise RunNotFoundError(f"{self.path}: no run {run_id}")
            settings = json.loads(row[0] or "{}") | entries
            con.execute("UPDATE runs SET settings = ?, updated_at = ? WHERE run_id = ?",
                        [json.dumps(settings), _now(), run_id])

    def delete_run(self, run: int | str) -> None:
        run_id = self.run(run).run_id
        with self.transaction() as con:
            for table in ("example_metrics", "extractions", "secret_attacks", "scores", "batches", "points",
                          "examples", "runs"):
                con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])

    # ----------------------------------------------------------------- reading
    def _query(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> pd.DataFrame:
        with self.connect(read_only=True) as con:
            return con.execute(sql, params if isinstance(params, dict) else list(params)).df()

    def runs(self) -> pd.DataFrame:
        """Every run with its settings, status, progress and sizes; newest first.  A 'running' run
        whose process is gone is shown as 'interrupted' (see :func:`liveness.run_is_alive`)."""
        return with_liveness(self._query("""
            SELECT r.*,
                   (SELECT count(*) FROM points p WHERE p.run_id = r.run_id AND p.status = 'done')
                       AS points_done,
                   (SELECT count(*) FROM points p WHERE p.run_id = r.run_id) AS points_total,
                   (SELECT count(*) FROM extractions e WHERE e.run_id = r.run_id) AS extraction_rows
            FROM runs r ORDER BY r.run_id DESC"""))

    def run(self, ref: int | str) -> Run:
        """A run by id or by name (a name that is all digits is tried as a name first)."""
        rows = self._query("SELECT * FROM runs WHERE name = ?", [str(ref)])
        if rows.empty and str(ref).isascii() and str(ref).isdigit():
            rows = self._query("SELECT * FROM runs WHERE run_id = ?", [int(ref)])
        if rows.empty:
            names = self._query("SELECT name FROM runs ORDER BY run_id")["name"].tolist()
            known = f" (runs: {', '.join(names)})" if names else " (the store has no runs yet)"
            raise RunNotFoundError(f"{self.path}: no run {ref!r}{known}")
        return Run.from_row(with_liveness(rows).iloc[0].to_dict())

    def find_run(self, name: str) -> Run | None:
        rows = self._query("SELECT * FROM runs WHERE name = ?", [name])
        return None if rows.empty else Run.from_row(with_liveness(rows).iloc[0].to_dict())

    def training_run_of(self, run_id: int) -> Run | None:
        """The in-run training run whose epoch checkpoints this run audited (a point with the same
        weights hash, and the same dataset), or None: its in-run GNQ is the same texts' GNQ
        accumulated over every training step."""
        rows = self._query("""
            SELECT DISTINCT rt.* FROM points a
            JOIN points t ON t.model_hash = a.model_hash AND t.run_id <> a.run_id
            JOIN runs ra ON ra.run_id = a.run_id
            JOIN runs rt ON rt.run_id = t.run_id
            WHERE a.run_id = ? AND a.model_hash IS NOT NULL AND rt.kind = 'train'
              AND rt.dataset_hash = ra.dataset_hash AND rt.n_examples = ra.n_examples
            ORDER BY rt.run_id DESC LIMIT 1""", [run_id])
        return None if rows.empty else Run.from_row(rows.iloc[0].to_dict())

    def points(self, run_id: int) -> pd.DataFrame:
        return self._query("SELECT * FROM points WHERE run_id = ? ORDER BY point", [run_id])

    def examples(self, run_id: int) -> pd.DataFrame:
        return self._query(f"SELECT example_id, text, grp, n_tokens, {', '.join(TEXT_LABEL_COLUMNS)} "
                           "FROM examples WHERE run_id = ? ORDER BY example_id", [run_id])

    def too_short_to_score(self, run_id: int) -> int:
        """How many of a run's texts have fewer than 2 tokens: no next token, so no GNQ or loss."""
        with self.connect(read_only=True) as con:
            return con.execute("SELECT count(*) FROM examples WHERE run_id = ? AND n_tokens < 2",
                               [run_id]).fetchone()[0]

    def text_labels_missing(self, run_id: int) -> bool:
        """Whether some of a run's examples have no copy/secret labels yet (ensure_text_labels)."""
        with self.connect(read_only=True) as con:
            return con.execute("SELECT count(*) FROM examples WHERE run_id = ? AND copies IS NULL",
                               [run_id]).fetchone()[0] > 0

    def cluster_ids(self, run_id: int) -> np.ndarray:
        """Each example's copy cluster (int64, in example_id order), without reading the texts."""
        with self.connect(read_only=True) as con:
            got = con.execute("SELECT cluster_id FROM examples WHERE run_id = ? ORDER BY example_id",
                              [run_id]).fetchnumpy()["cluster_id"]
        return np.asarray(got, dtype=np.int64)

    def _rows_of(self, table: str, run_id: int, point: int | None, order_by: str) -> pd.DataFrame:
        """All of a run's rows in ``table``, or one point's."""
        sql = f"SELECT * FROM {table} WHERE run_id = ?"
        params: list[Any] = [run_id]
        if point is not None:
            sql += " AND point = ?"
            params.append(point)
        return self._query(f"{sql} ORDER BY {order_by}", params)

    def scores(self, run_id: int, point: int | None = None) -> pd.DataFrame:
        return self._rows_of("scores", run_id, point, "point, example_id")

    def batches(self, run_id: int) -> pd.DataFrame:
        return self._query("SELECT * FROM batches WHERE run_id = ? ORDER BY point, batch_index", [run_id])

    def example_totals(self, run_id: int) -> pd.DataFrame:
        """Per example over the run's finished points: GNQ total/max/last/mean, last loss and
        self-influence, GNQ's rank (1 = highest GNQ total) and percentile, the text's copies and
        secret label, in how many points its GNQ was measured with a copy in its batch, the
        latest attack (calibrated: ``extracted`` needs the reference model *not* to reproduce
        the text too) and the calibrated membership scores."""
        return self._query(_TOTALS_SQL + " SELECT * FROM totals ORDER BY gnq_rank, example_id",
                           {"run": run_id})

    def steps_with_copies(self, run_id: int) -> tuple[int, int]:
        """(batches in which two members of one copy cluster shared the batch, all batches) over
        the run's finished points; for a training run a batch is an optimizer step."""
        row = self._query("""
            WITH per AS (
                SELECT s.point, s.batch_index, count(*) - count(DISTINCT e.cluster_id) AS extra
                FROM scores s JOIN examples e ON e.run_id = s.run_id AND e.example_id = s.example_id
                JOIN points p ON p.run_id = s.run_id AND p.point = s.point
                WHERE s.run_id = ? AND p.status = 'done' AND e.cluster_id IS NOT NULL
                GROUP BY s.point, s.batch_index)
            SELECT count(*) FILTER (WHERE extra > 0) AS shared, count(*) AS total FROM per""", [run_id])
        return int(row["shared"].iloc[0]), int(row["total"].iloc[0])

    def trajectories(self, run_id: int, example_ids: Sequence[int] | None = None) -> pd.DataFrame:
        """Long format: example_id, point, label, gnq, loss, self_influence, group."""
        sql = """SELECT s.example_id, s.point, p.label, s.step, s.gnq, s.loss, s.self_influence,
                        e.grp AS "group"
                 FROM scores s JOIN points p USING (run_id, point)
                 JOIN examples e ON e.run_id = s.run_id AND e.example_id = s.example_id
                 WHERE s.run_id = ? AND p.status = 'done'"""
        params: list[Any] = [run_id]
        if example_ids is not None:
            ids = [int(i) for i in example_ids]
            if not ids:
                return self._query(sql + " AND FALSE", params)
            sql += f" AND s.example_id IN ({', '.join('?' * len(ids))})"
            params += ids
        return self._query(sql + " ORDER BY s.example_id, s.point", params)

    def trajectory_quantiles(self, run_id: int) -> pd.DataFrame:
        """Per point: the 10/50/90% quantiles of GNQ over all examples (aggregated in DuckDB, so a
        run of 100k examples draws as a band instead of 100k lines)."""
        return self._query("""
            SELECT s.point, p.label, quantile_cont(s.gnq, 0.1) AS q10, median(s.gnq) AS q50,
                   quantile_cont(s.gnq, 0.9) AS q90, count(s.gnq) AS n
            FROM scores s JOIN points p USING (run_id, point)
            WHERE s.run_id = ? AND p.status = 'done'
            GROUP BY s.point, p.label ORDER BY s.point""", [run_id])

    def extractions(self, run_id: int, point: int | None = None) -> pd.DataFrame:
        """The latest attack's rows (one point, the largest prefix set written last)."""
        return self._rows_of("extractions", run_id, point, "created_at DESC, example_id")

    def metrics(self, run_id: int) -> pd.DataFrame:
        """Per-example metrics of a run, wide: example_id plus one column per metric."""
        long = self._query("SELECT example_id, metric, value FROM example_metrics WHERE run_id = ? "
                           "ORDER BY example_id, metric", [run_id])
        if long.empty:
            return pd.DataFrame(columns=["example_id"])
        wide = long.pivot(index="example_id", columns="metric", values="value").reset_index()
        wide.columns.name = None
        return wide

    def example_record(self, run_id: int, example_id: int) -> dict[str, Any]:
        """Everything about one example: its totals row, trajectory and extraction attempts."""
        totals = self._query(_TOTALS_SQL + " SELECT * FROM totals WHERE example_id = $example",
                             {"run": run_id, "example": int(example_id)})
        if totals.empty:
            raise StoreError(f"{self.path}: run {run_id} has no example {example_id}")
        return {
            "totals": totals.iloc[0].to_dict(),
            "trajectory": self.trajectories(run_id, [example_id]),
            "extractions": self._query(
                "SELECT * FROM extractions WHERE run_id = ? AND example_id = ? ORDER BY created_at DESC",
                [run_id, int(example_id)]),
        }


# Per-example aggregates over finished points.  Parameter: $run.
# Calibrated membership scores the attack writes to example_metrics (pipelines/membership.py).
MEMBERSHIP_METRICS = ["attack_loss", "reference_loss", "loss_ratio", "zlib_ratio", "min_k_prob"]
_TOTALS_SQL = """
WITH done AS (SELECT point FROM points WHERE run_id = $run AND status = 'done'),
agg AS (
    SELECT s.example_id,
           sum(s.gnq) AS gnq_total, max(s.gnq) AS gnq_max, avg(s.gnq) AS gnq_mean,
           arg_max(s.gnq, s.point) AS gnq_last, arg_max(s.loss, s.point) AS loss_last,
           arg_max(s.self_influence, s.point) AS self_influence_last,
           count(s.gnq) AS n_points
    FROM scores s WHERE s.run_id = $run AND s.point IN (SELECT point FROM done)
    GROUP BY s.example_id),
batchmates AS (  -- how many members of the text's copy cluster shared its batch, per point
    SELECT s.example_id,
           count(*) OVER (PARTITION BY s.point, s.batch_index, coalesce(e.cluster_id, -1 - s.example_id))
               AS same
    FROM scores s JOIN examples e ON e.run_id = s.run_id AND e.example_id = s.example_id
    WHERE s.run_id = $run AND s.point IN (SELECT point FROM done)),
copy_batches AS (
    SELECT example_id, CAST(count(*) FILTER (WHERE same > 1) AS INTEGER) AS gnq_with_copy
    FROM batchmates GROUP BY example_id),
latest_attack AS (
    SELECT * FROM extractions WHERE run_id = $run
    QUALIFY row_number() OVER (PARTITION BY example_id ORDER BY created_at DESC, point DESC,
                                                         prefix_tokens DESC) = 1),
secret_attack AS (  -- per text, over its secret-like values (usually one)
    SELECT example_id, bool_or(extracted) AS secret_reproduced, sum(chars) AS secret_chars,
           sum(chars_reproduced) AS secret_chars_reproduced,
           sum(reference_chars_reproduced) AS reference_secret_chars_reproduced,
           max(exposure) AS secret_exposure, string_agg(generated, ' | ') AS secret_generated
    FROM secret_attacks WHERE run_id = $run GROUP BY example_id),
membership AS (
    SELECT example_id, """ + ", ".join(
    f"max(value) FILTER (WHERE metric = '{m}') AS {m}" for m in MEMBERSHIP_METRICS) + """
    FROM example_metrics WHERE run_id = $run GROUP BY example_id),
totals AS (
    SELECT e.example_id, e.text, e.grp AS "group", e.n_tokens,
           a.gnq_total, a.gnq_max, a.gnq_last, a.gnq_mean, a.loss_last, a.self_influence_last, a.n_points,
           CAST(rank() OVER (ORDER BY a.gnq_total DESC NULLS LAST) AS INTEGER) AS gnq_rank,
           100.0 * cume_dist() OVER (ORDER BY a.gnq_total ASC NULLS FIRST) AS gnq_percentile,
           e.copies, e.cluster_id, c.gnq_with_copy,
           e.secret, e.secret_start, e.secret_end, e.secret_match,
           x.match_fraction AS extraction_match, x.reference_match,
           x.success AS reproduced,
           x.success AND NOT coalesce(x.reference_match >= x.threshold, FALSE) AS extracted,
           x.generated_text AS extraction_generated, x.prefix_tokens AS attack_prefix_tokens,
           x.suffix_tokens AS attack_suffix_tokens,
           sa.secret_reproduced, CAST(sa.secret_chars AS INTEGER) AS secret_chars,
           CAST(sa.secret_chars_reproduced AS INTEGER) AS secret_chars_reproduced,
           CAST(sa.reference_secret_chars_reproduced AS INTEGER) AS reference_secret_chars_reproduced,
           sa.secret_exposure, sa.secret_generated,
           """ + ", ".join(f"m.{m}" for m in MEMBERSHIP_METRICS) + """
    FROM examples e
    LEFT JOIN agg a USING (example_id)
    LEFT JOIN copy_batches c USING (example_id)
    LEFT JOIN latest_attack x USING (example_id)
    LEFT JOIN membership m USING (example_id)
    LEFT JOIN secret_attack sa USING (example_id)
    WHERE e.run_id = $run)
"""


def _insert_run(con: duckdb.DuckDBPyConnection, spec: RunSpec) -> int:
    now = _now()
    return con.execute(
        """INSERT INTO runs (name, kind, status, created_at, updated_at, lam, loss_convention,
               batch_size, seed, max_length, model_path, model_hash, dataset_path, dataset_hash,
               n_examples, code_version, device, dtype, settings, pid, host, heartbeat_at)
           VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
           RETURNING run_id""",
        [spec.name, spec.kind, now, now, spec.lam, LOSS_IN_WORDS[spec.loss], spec.batch_size, spec.seed,
         spec.max_length, spec.model_path, spec.model_hash, spec.dataset_path, spec.dataset_hash,
         spec.n_examples, spec.code_version, spec.device, spec.dtype, json.dumps(spec.settings),
         os.getpid(), socket.gethostname(), now]).fetchone()[0]


# The secret attack's columns (pipelines/secret_attack.py; migration 0008), as the attack writes them.
SECRET_ATTACK_COLUMNS = ["example_id", "secret_start", "secret_end", "kind", "value", "prompt_tokens",
                         "value_tokens", "generated", "chars", "chars_reproduced", "reproduced",
                         "reference_generated", "reference_chars_reproduced", "extracted", "exposure",
                         "exposure_rank", "exposure_candidates", "rule"]


# Per-text properties of the text within its dataset (sources/copies.py, sources/secrets.py).
TEXT_LABEL_COLUMNS = ["copies", "cluster_id", "secret", "secret_start", "secret_end", "secret_match"]


def _insert_examples(con: duckdb.DuckDBPyConnection, run_id: int, examples: pd.DataFrame | None) -> None:
    """Insert a run's examples; the text-label columns are NULL unless the frame has them."""
    if examples is not None and len(examples):
        labels = [c for c in TEXT_LABEL_COLUMNS if c in examples.columns]
        columns = ["run_id", "example_id", "text", "grp", "n_tokens", *labels]
        con.register("new_examples", examples.assign(run_id=run_id)[columns])
        con.execute(f"INSERT INTO examples ({', '.join(columns)}) SELECT * FROM new_examples")
        con.unregister("new_examples")


# Columns of the scores / batches tables that a Parquet shard carries (all but run_id).
SHARD_COLUMNS = {"scores": ["point", *SCORE_COLUMNS], "batches": ["point", *BATCH_COLUMNS]}
_SHARD_KEYS = {"scores": "point, example_id", "batches": "point, batch_index"}


def shard_select(table: str, files: Sequence[str], run_id: int) -> str:
    """SELECT of a table's rows straight from Parquet shards, as run ``run_id``.

    An example can appear twice in one point (a distributed sampler pads the last batches by
    repeating examples): its first occurrence (lowest step) is kept, as the table's key wants.
    Columns beyond ``SHARD_COLUMNS`` (``TextResult.extra``) come along, matched by name.
    """
    paths = ", ".join(duckdb_literal(f) for f in files)  # literal: no glob semantics
    return (f"SELECT {int(run_id)} AS run_id, * FROM read_parquet([{paths}], union_by_name = true) "
            f"QUALIFY row_number() OVER (PARTITION BY {_SHARD_KEYS[table]} ORDER BY step, batch_index) = 1")


def _current_version(con: duckdb.DuckDBPyConnection, path: Path) -> int:
    tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    if "schema_version" not in tables:
        if tables:
            raise StoreError(f"{path}: a DuckDB file, but not a GNQ store "
                             f"(tables: {', '.join(sorted(tables))})")
        return 0
    version = con.execute("SELECT max(version) FROM schema_version").fetchone()[0] or 0
    if version > SCHEMA_VERSION:
        raise StoreError(f"{path}: written by a newer GNQ Audit (schema {version}, this one knows "
                         f"{SCHEMA_VERSION}); upgrade gnq-audit")
    return int(version)


def _apply_migrations(con: duckdb.DuckDBPyConnection, current: int, target: int | None = None) -> None:
    """Apply each pending migration in its own transaction, recording it in schema_version."""
    for version, path in migrations():
        if version <= current or (target is not None and version > target):
            continue
        with _atomically(con):
            if version == 1:
                con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, "
                            "applied_at TIMESTAMP NOT NULL)")
            con.execute(path.read_text())
            con.execute("INSERT INTO schema_version VALUES (?, ?)", [version, _now()])


@contextlib.contextmanager
def _atomically(con: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    con.execute("BEGIN TRANSACTION")
    try:
        yield con
    except BaseException:
        with contextlib.suppress(duckdb.Error):  # a failed write may have aborted it already
            con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")

