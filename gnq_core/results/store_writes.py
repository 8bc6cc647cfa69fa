"""The store's writes: runs, their points' rows (each point with its 'done' mark in one
transaction), attacks, metrics, labels, status and progress, and runs ingested from Parquet
shards.  A mixin of ``Store``, which provides the transactions (``transaction``)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

from gnq_core.engine.math.conventions import TOKEN_MEAN, TOKEN_SUM
from gnq_core.errors import one_line
from gnq_core.results.literal_paths import duckdb_literal
from gnq_core.results.records import (
    BATCH_COLUMNS,
    SCORE_COLUMNS,
    BatchResult,
    RunSpec,
    ScoreColumns,
    batch_frame,
    resume_mismatches,
)
from gnq_core.results.shard_files import SECRET_TRACKING_COLUMNS
from gnq_core.results.store_queries import Run
from gnq_core.results.store_schema import (
    TEXT_LABEL_COLUMNS,
    TURNS_COLUMN,
    RunNotFoundError,
    StoreError,
    timestamp,
)

# The runs table's loss_convention column: the engine's conventions (engine/math/losses.py) in words.
LOSS_IN_WORDS = {TOKEN_MEAN: "per-example mean next-token NLL over the example's own tokens",
                 TOKEN_SUM: "per-example summed next-token NLL over the example's own tokens"}


_TURN_COLUMNS = ("turn", "turn_trained")  # the chat turn a window was in (attacks/windows.py)
_CALIBRATION_COLUMNS = ["suffix_tokens", "reference_match", "reference_generated"]


class StoreWrites:
    """The writing half of ``Store`` (results/store.py)."""

    path: Path

    def create_run(self, spec: RunSpec, examples: pd.DataFrame | None = None) -> Run:
        """Insert a run and its examples (columns example_id, text, grp, n_tokens) in one transaction."""
        with self.transaction() as con:
            if con.execute("SELECT 1 FROM runs WHERE name = ?", [spec.name]).fetchone():
                raise StoreError(f"{self.path}: a run named {spec.name!r} already exists")
            run_id = insert_run(con, spec)
            insert_examples(con, run_id, examples)
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
                   score_files: Sequence[str], batch_files: Sequence[str], *, status: str,
                   tracking: pd.DataFrame | None = None) -> Run:
        """A run written elsewhere as Parquet shards (gnq_core.results.shards), in one transaction.

        ``spec``: the run, whose ``settings['shard_id']`` names the
        shards; a rerun on the same shards replaces the run's examples, points, scores and
        batches (idempotent; its id and extraction attacks are kept).  ``points``: point, label,
        kind, status.  Scores and batches are read by DuckDB straight from the files.
        ``tracking``: the secret values probed while training (``SECRET_TRACKING_COLUMNS``).
        """
        shard_id = spec.settings.get("shard_id")
        with self.transaction() as con:
            row = con.execute("SELECT run_id, settings FROM runs WHERE name = ?", [spec.name]).fetchone()
            if row is None:
                run_id = insert_run(con, spec)
            else:
                run_id, settings = row
                if not shard_id or json.loads(settings or "{}").get("shard_id") != shard_id:
                    raise StoreError(f"{self.path}: a run named {spec.name!r} already exists and was "
                                     "not ingested from these shards")
                for table in ("examples", "points", "scores", "batches", "secret_tracking"):
                    con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
            insert_examples(con, run_id, examples)
            _insert_frame(con, "points", points.reindex(columns=POINT_COLUMNS).assign(run_id=run_id))
            if score_files:
                con.execute(f"INSERT INTO scores BY NAME {shard_select('scores', score_files, run_id)}")
            if batch_files:
                con.execute(f"INSERT INTO batches BY NAME {shard_select('batches', batch_files, run_id)}")
            if tracking is not None and len(tracking):
                _insert_frame(con, "secret_tracking",
                              tracking.reindex(columns=SECRET_TRACKING_COLUMNS).assign(run_id=run_id)[
                                  ["run_id", *SECRET_TRACKING_COLUMNS]])
            con.execute("UPDATE runs SET status = ?, updated_at = ?, settings = ? WHERE run_id = ?",
                        [status, timestamp(), json.dumps(spec.settings), run_id])
        return self.run(run_id)

    def set_status(self, run: int | str, status: str, message: str | None = None) -> None:
        """The run's status; 'running' also records this process as its owner (see liveness)."""
        run_id = self.run(run).run_id
        with self.transaction() as con:
            con.execute("""UPDATE runs SET status = ?, message = ?, updated_at = ?, pid = ?, host = ?,
                           heartbeat_at = ? WHERE run_id = ?""",
                        [status, message, timestamp(), os.getpid(), socket.gethostname(), timestamp(),
                         run_id])

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
            self._mark(run_id, "failed", one_line(exc))
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
                        [done, total, note, timestamp(), os.getpid(), socket.gethostname(), timestamp(),
                         run_id])

    def add_points(self, run_id: int, points: Sequence[dict[str, Any]]) -> None:
        """Register trajectory points (label, kind, path, model_hash) as pending; existing ones are kept."""
        with self.transaction() as con:
            for p in points:
                con.execute("""INSERT INTO points (run_id, point, label, kind, path, model_hash, status)
                               VALUES (?, ?, ?, ?, ?, ?, 'pending') ON CONFLICT DO NOTHING""",
                            [run_id, p["point"], p["label"], p["kind"], p.get("path"), p.get("model_hash")])

    def write_point(self, run_id: int, point: int, texts: ScoreColumns,
                    batches: Sequence[BatchResult], seconds: float, *, path: str | None = None,
                    model_hash: str | None = None) -> None:
        """All of one point's rows and its 'done' mark, atomically (a rerun replaces, never duplicates)."""
        with self.transaction() as con:
            for table in ("scores", "batches"):
                con.execute(f"DELETE FROM {table} WHERE run_id = ? AND point = ?", [run_id, point])
            for frame in texts.frames(point):  # in chunks, never one frame of all
                _insert_frame(con, "scores", frame.assign(run_id=run_id))
            _insert_frame(con, "batches", batch_frame(batches, point).assign(run_id=run_id))
            con.execute("""UPDATE points SET status = 'done', seconds = ?, finished_at = ?,
                           path = coalesce(?, path), model_hash = coalesce(?, model_hash)
                           WHERE run_id = ? AND point = ?""",
                        [seconds, timestamp(), path, model_hash, run_id, point])
            # The run's model: for an audit (or a training from scratch) the latest checkpoint's
            # weights; a fine-tune keeps its base model's hash.
            con.execute("""UPDATE runs SET updated_at = ?, model_hash = CASE
                               WHEN kind = 'audit' OR json_extract_string(settings, '$.init') IS NULL
                               THEN coalesce(?, model_hash) ELSE model_hash END
                           WHERE run_id = ?""", [timestamp(), model_hash, run_id])

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
                                code_version=code_version, created_at=timestamp())
            # absent: an uncalibrated attack over the rest of the text; a plain text's window (no turn)
            for column in (*_CALIBRATION_COLUMNS, *_TURN_COLUMNS):
                if column not in frame.columns:
                    frame[column] = None
            frame = frame[["run_id", "point", "example_id", "prefix_tokens", "threshold", "n_continuation",
                           "match_fraction", "success", "prefix_text", "generated_text", "target_text",
                           "code_version", "created_at", "target_tokens", "generated_tokens",
                           *_CALIBRATION_COLUMNS, *_TURN_COLUMNS]]
            frame = frame.astype({"suffix_tokens": "Int64", "reference_match": "Float64", "turn": "string",
                                  "turn_trained": "boolean"})
            con.register("new_extractions", frame)
            con.execute("""DELETE FROM extractions WHERE run_id = ? AND point = ? AND prefix_tokens = ?
                           AND example_id IN (SELECT example_id FROM new_extractions)""",
                        [run_id, point, prefix_tokens])
            con.execute("INSERT INTO extractions SELECT * FROM new_extractions")

    def write_secret_attacks(self, run_id: int, point: int, rows: pd.DataFrame, code_version: str,
                             null: pd.DataFrame | None = None, rule: str = "") -> None:
        """The secret-targeted attack's rows (attacks/secret_attack.py) and its exposure null
        at one point, replacing the run's earlier ones (the latest attack is the one shown), in
        one transaction."""
        now = timestamp()
        frame = rows.reindex(columns=SECRET_ATTACK_COLUMNS).assign(
            run_id=run_id, point=point, code_version=code_version, created_at=now)
        nulls = (null if null is not None else pd.DataFrame(columns=SECRET_NULL_COLUMNS)).reindex(
            columns=SECRET_NULL_COLUMNS).assign(run_id=run_id, point=point, rule=rule,
                                                code_version=code_version, created_at=now)
        with self.transaction() as con:
            con.execute("DELETE FROM secret_attacks WHERE run_id = ?", [run_id])
            con.execute("DELETE FROM secret_exposure_null WHERE run_id = ?", [run_id])
            _insert_frame(con, "secret_attacks", frame)
            if len(nulls):
                _insert_frame(con, "secret_exposure_null", nulls)

    def delete_extractions(self, run_id: int, point: int, prefix_tokens: int) -> None:
        with self.transaction() as con:
            con.execute("DELETE FROM extractions WHERE run_id = ? AND point = ? AND prefix_tokens = ?",
                        [run_id, point, prefix_tokens])

    def write_metric(self, run_id: int, metric: str, values: pd.DataFrame,
                     settings: dict[str, Any] | None = None) -> None:
        """One per-example metric (columns example_id, value), replacing that metric's earlier rows."""
        with self.transaction() as con:
            con.execute("DELETE FROM example_metrics WHERE run_id = ? AND metric = ?", [run_id, metric])
            frame = values.assign(run_id=run_id, metric=metric, settings=json.dumps(settings or {}),
                                  created_at=timestamp())
            _insert_frame(con, "example_metrics",
                          frame[["run_id", "example_id", "metric", "value", "settings", "created_at"]])

    def write_text_labels(self, run_id: int, labels: pd.DataFrame) -> None:
        """Copies and secret labels of a run's texts (columns example_id + TEXT_LABEL_COLUMNS)."""
        frame = labels[["example_id", *TEXT_LABEL_COLUMNS]].astype(
            {"copies": "Int64", "cluster_id": "Int64", "secret_start": "Int64", "secret_end": "Int64",
             "public": "boolean"})
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
                        [json.dumps(settings), timestamp(), run_id])

    def delete_run(self, run: int | str) -> None:
        run_id = self.run(run).run_id
        with self.transaction() as con:
            for table in ("example_metrics", "extractions", "secret_attacks", "secret_exposure_null",
                          "secret_tracking", "scores", "batches", "points", "examples", "runs"):
                con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])


def insert_run(con: duckdb.DuckDBPyConnection, spec: RunSpec) -> int:
    now = timestamp()
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


# The secret attack's columns (attacks/secret_attack.py; migrations 0009, 0011, 0013, 0015, 0017), as the
# attack writes them, and its exposure null's (attacks/secret_exposure.py; migrations 0013, 0017).
SECRET_ATTACK_COLUMNS = ["example_id", "secret_start", "secret_end", "kind", "value", "prompt_tokens",
                         "value_tokens", "generated", "chars", "chars_reproduced", "reproduced",
                         "reference_generated", "reference_chars_reproduced", "extracted", "exposure",
                         "exposure_rank", "exposure_candidates", "rule", "novel_chars_reproduced",
                         "exposure_method", "exposure_template", "exposure_space_bits", "exposure_nodes",
                         "exposure_fit", "value_copies", "reference_exposure", "reference_exposure_method",
                         "reference_exposure_rank", "exposure_null_p99", "exposed", "free_chars",
                         "free_null_mean", "free_null_p", "exposure_p", "log_ratio", "reference_ratio_p",
                         "exposure_fdr_q"]
SECRET_NULL_COLUMNS = ["kind", "template", "value", "prompt_example_id", "exposure", "exposure_method",
                       "exposure_rank", "exposure_nodes", "exposure_fit", "log_ratio"]


def insert_examples(con: duckdb.DuckDBPyConnection, run_id: int, examples: pd.DataFrame | None) -> None:
    """Insert a run's examples; the text-label columns are NULL unless the frame has them."""
    if examples is not None and len(examples):
        labels = [c for c in (*TEXT_LABEL_COLUMNS, TURNS_COLUMN) if c in examples.columns]
        _insert_frame(con, "examples", examples.assign(run_id=run_id)[["run_id", "example_id", "text", "grp",
                                                                        "n_tokens", *labels]])


def _insert_frame(con: duckdb.DuckDBPyConnection, table: str, frame: pd.DataFrame) -> None:
    """Append a frame's rows to ``table``, its columns matched by name."""
    con.register("new_rows", frame)
    con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM new_rows")
    con.unregister("new_rows")


# A run's points as shards describe them (path / model_hash: None where no checkpoint was saved).
POINT_COLUMNS = ["point", "label", "kind", "status", "path", "model_hash"]

# Columns of the scores / batches tables that a Parquet shard carries (all but run_id).
SHARD_COLUMNS = {"scores": ["point", *SCORE_COLUMNS], "batches": ["point", *BATCH_COLUMNS]}
_SHARD_KEYS = {"scores": "point, example_id", "batches": "point, batch_index"}


def shard_select(table: str, files: Sequence[str], run_id: int) -> str:
    """SELECT of a table's rows straight from Parquet shards, as run ``run_id``.

    An example can appear twice in one point (a distributed sampler pads the last batches by
    repeating examples): its first occurrence (lowest step) is kept, as the table's key wants.
    Columns beyond ``SHARD_COLUMNS`` (``ScoreColumns.extra``) come along, matched by name.
    """
    paths = ", ".join(duckdb_literal(f) for f in files)  # literal: no glob semantics
    return (f"SELECT {int(run_id)} AS run_id, * FROM read_parquet([{paths}], union_by_name = true) "
            f"QUALIFY row_number() OVER (PARTITION BY {_SHARD_KEYS[table]} ORDER BY step, batch_index) = 1")
