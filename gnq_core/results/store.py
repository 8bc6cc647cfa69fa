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
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
DEFAULT_DB = Path("data") / "gnq.duckdb"
LOSS_CONVENTION = "per-example mean next-token NLL over the example's own tokens"
WAIT_MESSAGE_EVERY = 300.0  # seconds between two "busy; waiting" messages of one Store


class StoreError(RuntimeError):
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


@dataclass(frozen=True)
class Run:
    run_id: int
    name: str
    kind: str
    status: str
    lam: float
    batch_size: int
    seed: int
    max_length: int
    model_path: str
    dataset_path: str
    dataset_hash: str
    n_examples: int
    settings: dict[str, Any]

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Run:
        settings = row.get("settings")
        return cls(run_id=int(row["run_id"]), name=row["name"], kind=row["kind"], status=row["status"],
                   lam=float(row["lam"]), batch_size=int(row["batch_size"]), seed=int(row["seed"]),
                   max_length=int(row["max_length"]), model_path=row["model_path"],
                   dataset_path=row["dataset_path"], dataset_hash=row["dataset_hash"],
                   n_examples=int(row["n_examples"]),
                   settings=json.loads(settings) if isinstance(settings, str) else (settings or {}))


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
        finally:
            con.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A write connection inside BEGIN/COMMIT; rolled back on any exception."""
        with self.connect() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    def _open(self, read_only: bool) -> duckdb.DuckDBPyConnection:
        deadline = time.monotonic() + self.busy_timeout
        delay = 0.05
        while True:
            try:
                return duckdb.connect(str(self.path), read_only=read_only)
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower():
                    raise StoreError(f"{self.path}: cannot open the store ({_first_line(exc)})") from None
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
                raise StoreError(f"{self.path}: not a GNQ store ({_first_line(exc)})") from None
            except RuntimeError as exc:  # duckdb raises some file errors as plain RuntimeError
                raise StoreError(f"{self.path}: cannot open the store ({_first_line(exc)})") from None

    def _ensure_schema(self) -> None:
        if self._ready:
            return
        if self.path.is_dir():
            raise StoreError(f"{self.path}: is a folder, not a DuckDB file")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        con = self._open(read_only=False)
        try:
            _apply_migrations(con, _current_version(con, self.path))
        finally:
            con.close()
        self._ready = True

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
    def create_run(self, *, name: str, kind: str, lam: float, batch_size: int, seed: int, max_length: int,
                   model_path: str, dataset_path: str, dataset_hash: str, n_examples: int,
                   code_version: str, device: str | None, dtype: str | None, model_hash: str | None = None,
                   settings: dict[str, Any] | None = None, examples: pd.DataFrame | None = None) -> Run:
        """Insert a run and its examples (columns example_id, text, grp, n_tokens) in one transaction."""
        with self.transaction() as con:
            if con.execute("SELECT 1 FROM runs WHERE name = ?", [name]).fetchone():
                raise StoreError(f"{self.path}: a run named {name!r} already exists")
            run_id = _insert_run(con, dict(
                name=name, kind=kind, lam=lam, batch_size=batch_size, seed=seed, max_length=max_length,
                model_path=model_path, model_hash=model_hash, dataset_path=dataset_path,
                dataset_hash=dataset_hash, n_examples=n_examples, code_version=code_version, device=device,
                dtype=dtype, settings=settings))
            _insert_examples(con, run_id, examples)
        return self.run(run_id)

    def import_run(self, fields: dict[str, Any], examples: pd.DataFrame, points: pd.DataFrame,
                   score_files: Sequence[str], batch_files: Sequence[str], *, status: str) -> Run:
        """A run written elsewhere as Parquet shards (gnq_core.results.shards), in one transaction.

        ``fields``: the runs columns (as ``create_run``), whose ``settings['shard_id']`` names the
        shards; a rerun on the same shards replaces the run's examples, points, scores and
        batches (idempotent; its id and extraction attacks are kept).  ``points``: point, label,
        kind, status.  Scores and batches are read by DuckDB straight from the files.
        """
        shard_id = (fields.get("settings") or {}).get("shard_id")
        with self.transaction() as con:
            row = con.execute("SELECT run_id, settings FROM runs WHERE name = ?", [fields["name"]]).fetchone()
            if row is None:
                run_id = _insert_run(con, fields)
            else:
                run_id, settings = row
                if not shard_id or json.loads(settings or "{}").get("shard_id") != shard_id:
                    raise StoreError(f"{self.path}: a run named {fields['name']!r} already exists and was "
                                     "not ingested from these shards")
                for table in ("examples", "points", "scores", "batches"):
                    con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
            _insert_examples(con, run_id, examples)
            frame = points.assign(run_id=run_id)[["run_id", "point", "label", "kind", "status"]]
            con.register("new_points", frame)
            con.execute("INSERT INTO points (run_id, point, label, kind, status) SELECT * FROM new_points")
            con.unregister("new_points")
            if score_files:
                con.execute(f"INSERT INTO scores {shard_select('scores', score_files, run_id)}")
            if batch_files:
                con.execute(f"INSERT INTO batches {shard_select('batches', batch_files, run_id)}")
            con.execute("UPDATE runs SET status = ?, updated_at = ?, settings = ? WHERE run_id = ?",
                        [status, _now(), json.dumps(fields.get("settings") or {}), run_id])
        return self.run(run_id)

    def set_status(self, run: int | str, status: str, message: str | None = None) -> None:
        run_id = self.run(run).run_id
        with self.transaction() as con:
            con.execute("UPDATE runs SET status = ?, message = ?, updated_at = ? WHERE run_id = ?",
                        [status, message, _now(), run_id])

    @contextlib.contextmanager
    def tracking(self, run_id: int) -> Iterator[None]:
        """Mark the run 'done' when the block finishes, 'cancelled' on Ctrl-C/SIGTERM (finished
        points are kept, a rerun resumes), 'failed' with the error's first line otherwise."""
        try:
            yield
        except KeyboardInterrupt:
            self.set_status(run_id, "cancelled", "interrupted; rerun the same command to resume")
            raise
        except Exception as exc:
            self.set_status(run_id, "failed", _first_line(exc))
            raise
        self.set_status(run_id, "done")

    def set_progress(self, run_id: int, done: int, total: int, note: str | None = None) -> None:
        with self.transaction() as con:
            con.execute("""UPDATE runs SET progress_done = ?, progress_total = ?, progress_note = ?,
                           updated_at = ?, pid = ? WHERE run_id = ?""",
                        [done, total, note, _now(), os.getpid(), run_id])

    def add_points(self, run_id: int, points: Sequence[dict[str, Any]]) -> None:
        """Register trajectory points (label, kind, path, model_hash) as pending; existing ones are kept."""
        with self.transaction() as con:
            for p in points:
                con.execute("""INSERT INTO points (run_id, point, label, kind, path, model_hash, status)
                               VALUES (?, ?, ?, ?, ?, ?, 'pending') ON CONFLICT DO NOTHING""",
                            [run_id, p["point"], p["label"], p["kind"], p.get("path"), p.get("model_hash")])

    def write_point(self, run_id: int, point: int, scores: pd.DataFrame, batches: pd.DataFrame,
                    seconds: float, *, path: str | None = None, model_hash: str | None = None) -> None:
        """All of one point's rows and its 'done' mark, atomically (a rerun replaces, never duplicates).

        ``scores``: example_id, batch_index, step, gnq, loss, self_influence.
        ``batches``: batch_index, step, size, condition, finite, seconds.
        """
        with self.transaction() as con:
            for table in ("scores", "batches"):
                con.execute(f"DELETE FROM {table} WHERE run_id = ? AND point = ?", [run_id, point])
            s = scores.assign(run_id=run_id, point=point)[
                ["run_id", "point", "example_id", "batch_index", "step", "gnq", "loss", "self_influence"]]
            b = batches.assign(run_id=run_id, point=point)[
                ["run_id", "point", "batch_index", "step", "size", "condition", "finite", "seconds"]]
            con.register("new_scores", s)
            con.register("new_batches", b)
            con.execute("INSERT INTO scores SELECT * FROM new_scores")
            con.execute("INSERT INTO batches SELECT * FROM new_batches")
            con.execute("""UPDATE points SET status = 'done', seconds = ?, finished_at = ?,
                           path = coalesce(?, path), model_hash = coalesce(?, model_hash)
                           WHERE run_id = ? AND point = ?""",
                        [seconds, _now(), path, model_hash, run_id, point])
            con.execute("UPDATE runs SET updated_at = ? WHERE run_id = ?", [_now(), run_id])

    def set_point_paths(self, run_id: int, paths: dict[int, str | None]) -> None:
        """Where points' checkpoint folders are now (None: deleted), in one transaction."""
        with self.transaction() as con:
            for point, path in paths.items():
                con.execute("UPDATE points SET path = ? WHERE run_id = ? AND point = ?",
                            [path, run_id, point])

    def write_extractions(self, run_id: int, point: int, prefix_tokens: int, rows: pd.DataFrame,
                          code_version: str) -> None:
        """Attack results for some examples (replacing those examples' earlier rows with the same
        prefix length), in one transaction: an attack is committed batch by batch."""
        with self.transaction() as con:
            frame = rows.assign(run_id=run_id, point=point, prefix_tokens=prefix_tokens,
                                code_version=code_version, created_at=_now())[
                ["run_id", "point", "example_id", "prefix_tokens", "threshold", "n_continuation",
                 "match_fraction", "success", "prefix_text", "generated_text", "target_text",
                 "code_version", "created_at", "target_tokens", "generated_tokens"]]
            con.register("new_extractions", frame)
            con.execute("""DELETE FROM extractions WHERE run_id = ? AND point = ? AND prefix_tokens = ?
                           AND example_id IN (SELECT example_id FROM new_extractions)""",
                        [run_id, point, prefix_tokens])
            con.execute("INSERT INTO extractions SELECT * FROM new_extractions")

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

    def delete_run(self, run: int | str) -> None:
        run_id = self.run(run).run_id
        with self.transaction() as con:
            for table in ("example_metrics", "extractions", "scores", "batches", "points", "examples",
                          "runs"):
                con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])

    # ----------------------------------------------------------------- reading
    def _query(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        with self.connect(read_only=True) as con:
            return con.execute(sql, list(params)).df()

    def runs(self) -> pd.DataFrame:
        """Every run with its settings, status, progress and sizes; newest first."""
        return self._query("""
            SELECT r.*,
                   (SELECT count(*) FROM points p WHERE p.run_id = r.run_id AND p.status = 'done')
                       AS points_done,
                   (SELECT count(*) FROM points p WHERE p.run_id = r.run_id) AS points_total,
                   (SELECT count(*) FROM extractions e WHERE e.run_id = r.run_id) AS extraction_rows
            FROM runs r ORDER BY r.run_id DESC""")

    def run(self, ref: int | str) -> Run:
        """A run by id or by name (a name that is all digits is tried as a name first)."""
        rows = self._query("SELECT * FROM runs WHERE name = ?", [str(ref)])
        if rows.empty and str(ref).isdigit():
            rows = self._query("SELECT * FROM runs WHERE run_id = ?", [int(ref)])
        if rows.empty:
            names = self._query("SELECT name FROM runs ORDER BY run_id")["name"].tolist()
            known = f" (runs: {', '.join(names)})" if names else " (the store has no runs yet)"
            raise RunNotFoundError(f"{self.path}: no run {ref!r}{known}")
        return Run.from_row(rows.iloc[0].to_dict())

    def find_run(self, name: str) -> Run | None:
        rows = self._query("SELECT * FROM runs WHERE name = ?", [name])
        return None if rows.empty else Run.from_row(rows.iloc[0].to_dict())

    def points(self, run_id: int) -> pd.DataFrame:
        return self._query("SELECT * FROM points WHERE run_id = ? ORDER BY point", [run_id])

    def examples(self, run_id: int) -> pd.DataFrame:
        return self._query("SELECT example_id, text, grp, n_tokens FROM examples WHERE run_id = ? "
                           "ORDER BY example_id", [run_id])

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
        self-influence, rank (1 = highest GNQ total), percentile, and the latest extraction."""
        return self._query(_TOTALS_SQL + " SELECT * FROM totals ORDER BY rank, example_id", [run_id] * 4)

    def flagged(self, run_id: int, *, top: int | None = None, min_percentile: float | None = None,
                min_gnq: float | None = None, group: str | None = None) -> pd.DataFrame:
        """The texts to export: filters combine (all must hold); ordered by rank."""
        where, params = ["TRUE"], [run_id] * 4
        if top is not None:
            where.append("rank <= ?")
            params.append(top)
        if min_percentile is not None:
            where.append("percentile >= ?")
            params.append(min_percentile)
        if min_gnq is not None:
            where.append("gnq_total >= ?")
            params.append(min_gnq)
        if group is not None:
            where.append("\"group\" = ?")
            params.append(group)
        return self._query(_TOTALS_SQL + f" SELECT * FROM totals WHERE {' AND '.join(where)} "
                           "ORDER BY rank, example_id", params)

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
        totals = self._query(_TOTALS_SQL + " SELECT * FROM totals WHERE example_id = ?",
                             [run_id] * 4 + [int(example_id)])
        if totals.empty:
            raise StoreError(f"{self.path}: run {run_id} has no example {example_id}")
        return {
            "totals": totals.iloc[0].to_dict(),
            "trajectory": self.trajectories(run_id, [example_id]),
            "extractions": self._query(
                "SELECT * FROM extractions WHERE run_id = ? AND example_id = ? ORDER BY created_at DESC",
                [run_id, int(example_id)]),
        }


# Per-example aggregates over finished points.  Parameters: run_id four times.
_TOTALS_SQL = """
WITH done AS (SELECT point FROM points WHERE run_id = ? AND status = 'done'),
last_point AS (SELECT max(point) AS point FROM done),
agg AS (
    SELECT s.example_id,
           sum(s.gnq) AS gnq_total, max(s.gnq) AS gnq_max, avg(s.gnq) AS gnq_mean,
           arg_max(s.gnq, s.point) AS gnq_last, arg_max(s.loss, s.point) AS loss_last,
           arg_max(s.self_influence, s.point) AS self_influence_last,
           count(s.gnq) AS n_points
    FROM scores s WHERE s.run_id = ? AND s.point IN (SELECT point FROM done)
    GROUP BY s.example_id),
latest_attack AS (
    SELECT * FROM extractions WHERE run_id = ?
    QUALIFY row_number() OVER (PARTITION BY example_id ORDER BY created_at DESC, point DESC,
                                                         prefix_tokens DESC) = 1),
totals AS (
    SELECT e.example_id, e.text, e.grp AS "group", e.n_tokens,
           a.gnq_total, a.gnq_max, a.gnq_last, a.gnq_mean, a.loss_last, a.self_influence_last, a.n_points,
           CAST(rank() OVER (ORDER BY a.gnq_total DESC NULLS LAST) AS INTEGER) AS rank,
           100.0 * cume_dist() OVER (ORDER BY a.gnq_total ASC NULLS FIRST) AS percentile,
           x.match_fraction AS extraction_match, x.success AS extracted,
           x.generated_text AS extraction_generated
    FROM examples e
    LEFT JOIN agg a USING (example_id)
    LEFT JOIN latest_attack x USING (example_id)
    WHERE e.run_id = ?)
"""


def _insert_run(con: duckdb.DuckDBPyConnection, f: dict[str, Any]) -> int:
    now = _now()
    return con.execute(
        """INSERT INTO runs (name, kind, status, created_at, updated_at, lam, loss_convention,
               batch_size, seed, max_length, model_path, model_hash, dataset_path, dataset_hash,
               n_examples, code_version, device, dtype, settings, pid)
           VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
           RETURNING run_id""",
        [f["name"], f["kind"], now, now, f["lam"], LOSS_CONVENTION, f["batch_size"], f["seed"],
         f["max_length"], f["model_path"], f.get("model_hash"), f["dataset_path"], f["dataset_hash"],
         f["n_examples"], f["code_version"], f.get("device"), f.get("dtype"),
         json.dumps(f.get("settings") or {}), os.getpid()]).fetchone()[0]


def _insert_examples(con: duckdb.DuckDBPyConnection, run_id: int, examples: pd.DataFrame | None) -> None:
    if examples is not None and len(examples):
        frame = examples.assign(run_id=run_id)[["run_id", "example_id", "text", "grp", "n_tokens"]]
        con.register("new_examples", frame)
        con.execute("INSERT INTO examples SELECT * FROM new_examples")
        con.unregister("new_examples")


# Columns of the scores / batches tables that a Parquet shard carries (all but run_id).
SHARD_COLUMNS = {
    "scores": ["point", "example_id", "batch_index", "step", "gnq", "loss", "self_influence"],
    "batches": ["point", "batch_index", "step", "size", "condition", "finite", "seconds"],
}
_SHARD_KEYS = {"scores": "point, example_id", "batches": "point, batch_index"}


def shard_select(table: str, files: Sequence[str], run_id: int) -> str:
    """SELECT of a table's rows straight from Parquet shards, as run ``run_id``.

    An example can appear twice in one point (a distributed sampler pads the last batches by
    repeating examples): its first occurrence (lowest step) is kept, as the table's key wants.
    """
    paths = ", ".join("'" + str(f).replace("'", "''") + "'" for f in files)
    columns = ", ".join(SHARD_COLUMNS[table])
    return (f"SELECT {int(run_id)} AS run_id, {columns} FROM read_parquet([{paths}]) "
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
        con.execute("BEGIN TRANSACTION")
        try:
            if version == 1:
                con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, "
                            "applied_at TIMESTAMP NOT NULL)")
            con.execute(path.read_text())
            con.execute("INSERT INTO schema_version VALUES (?, ?)", [version, _now()])
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
