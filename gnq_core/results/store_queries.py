"""The store's reads: runs, points, examples, scores, batches, attacks and metrics as frames, and
the per-example totals (``_TOTALS_SQL``) the verdict ranks.  A mixin of ``Store``, which
provides the connections (``connect``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gnq_core.results.liveness import with_liveness
from gnq_core.results.records import RunSpec
from gnq_core.results.store_schema import (
    PARTLY_LEAKED_SQL,
    TEXT_LABEL_COLUMNS,
    TURNS_COLUMN,
    RunNotFoundError,
    StoreError,
)


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


class StoreQueries:
    """The reading half of ``Store`` (results/store.py)."""

    path: Path

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
        return self._query(f"SELECT example_id, text, grp, n_tokens, {', '.join(TEXT_LABEL_COLUMNS)}, "
                           f"{TURNS_COLUMN} "
                           "FROM examples WHERE run_id = ? ORDER BY example_id", [run_id])

    def too_short_to_score(self, run_id: int) -> int:
        """How many of a run's texts have fewer than 2 tokens: no next token, so no GNQ or loss."""
        with self.connect(read_only=True) as con:
            return con.execute("SELECT count(*) FROM examples WHERE run_id = ? AND n_tokens < 2",
                               [run_id]).fetchone()[0]

    def without_companions(self, run_id: int) -> int:
        """How many of a run's texts were alone in their GNQ batch at some point (a last partial
        batch of one): no companions, so GNQ is NULL while loss and K_jj are kept."""
        with self.connect(read_only=True) as con:
            return con.execute("SELECT count(DISTINCT example_id) FROM scores WHERE run_id = ? "
                               "AND gnq IS NULL AND self_influence IS NOT NULL", [run_id]).fetchone()[0]

    def text_labels_missing(self, run_id: int) -> bool:
        """Whether some of a run's examples have no copy/secret labels yet (ensure_text_labels), or
        labels from before every value was kept (schema 11: ``public`` is written with them)."""
        with self.connect(read_only=True) as con:
            return con.execute("SELECT count(*) FROM examples WHERE run_id = ? AND (copies IS NULL OR "
                               "public IS NULL)", [run_id]).fetchone()[0] > 0

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

    def secret_attacks(self, run_id: int) -> pd.DataFrame:
        return self._rows_of("secret_attacks", run_id, None, "example_id, secret_start")

    def secret_exposure_null(self, run_id: int) -> pd.DataFrame:
        """The run's exposure null (attacks/secret_exposure.py): never-trained values per format."""
        return self._rows_of("secret_exposure_null", run_id, None, "kind, template, value")

    def secret_values(self, run_id: int) -> pd.DataFrame:
        """One row per distinct secret value with an exposure space (kind, value): its exposure
        under the audited and the reference model, rank, method (NULL: not measurable), copies
        and its format's null threshold (every copy carries the same numbers; the first
        occurrence's row)."""
        return self._query("""
            SELECT kind, value, exposure_template AS template, value_copies AS copies, exposure,
                   exposure_method AS method, exposure_rank AS rank, exposure_space_bits AS space_bits,
                   exposure_nodes AS nodes, exposure_candidates AS candidates, exposure_fit AS fit,
                   reference_exposure, reference_exposure_method AS reference_method,
                   reference_exposure_rank AS reference_rank, exposure_null_p99 AS null_p99, exposed,
                   exposure_p AS p_value, log_ratio, reference_ratio_p, exposure_fdr_q AS fdr_q,
                   bool_or(extracted) OVER (PARTITION BY kind, value) AS leaked
            FROM secret_attacks WHERE run_id = ? AND exposure_template IS NOT NULL
            QUALIFY row_number() OVER (PARTITION BY kind, value ORDER BY example_id, secret_start) = 1
            ORDER BY exposure DESC NULLS LAST, kind, value""", [run_id])

    def value_outcomes(self, run_id: int) -> pd.DataFrame:
        """One row per distinct attacked secret value (kind, value) of a run, over every occurrence
        the secret attack probed: ``leaked`` (some occurrence written whole, calibrated),
        ``partly`` (not whole, but PARTLY_LEAKED_SQL), ``exposed`` (above the null's 99th
        percentile and the reference), the most exposed occurrence's exposure and its bounds, the
        most characters written, and how many occurrences were probed (gnq remediate, gnq compare)."""
        return self._query(f"""
            SELECT kind, value, bool_or(extracted) AS leaked,
                   bool_or(NOT extracted AND {PARTLY_LEAKED_SQL}) AS partly,
                   bool_or(coalesce(exposed, FALSE)) AS exposed,
                   max(exposure) AS exposure, bool_or(exposure_method = 'estimated') AS exposure_estimated,
                   max(exposure_null_p99) AS null_p99, max(reference_exposure) AS reference_exposure,
                   max(chars) AS chars, max(chars_reproduced) AS chars_reproduced,
                   max(reference_chars_reproduced) AS reference_chars_reproduced,
                   CAST(count(*) AS INTEGER) AS occurrences_probed, min(example_id) AS first_example,
                   max(point) AS point
            FROM secret_attacks WHERE run_id = ?
            GROUP BY kind, value ORDER BY first_example, kind, value""", [run_id])

    def secret_tracking(self, run_id: int) -> pd.DataFrame:
        """The secret values probed while the run trained (integrations/tracking.py), per value and
        step: step, example_id, kind, value, chars, chars_reproduced, leaked, partly, exposure,
        exposure_method, null_p99, exposed, seconds."""
        return self._query("SELECT * EXCLUDE (run_id) FROM secret_tracking WHERE run_id = ? "
                           "ORDER BY kind, value, example_id, step", [run_id])

    def attacked_examples(self, run_id: int, point: int, prefix_tokens: int,
                          threshold: float) -> set[int] | None:
        """Examples with a stored attack at this point and prefix length; None when some were
        attacked with another threshold (the stored attack cannot be resumed, only replaced)."""
        rows = self._query("SELECT example_id, threshold FROM extractions WHERE run_id = ? AND point = ? "
                           "AND prefix_tokens = ?", [run_id, point, prefix_tokens])
        if (rows["threshold"] != threshold).any():
            return None
        return set(rows["example_id"].astype(int))


# Per-example aggregates over finished points.  Parameter: $run.
# Calibrated membership scores the attack writes to example_metrics (attacks/membership.py).
MEMBERSHIP_METRICS = ["attack_loss", "reference_loss", "loss_ratio", "zlib_ratio", "min_k_prob"]
_TOTALS_SQL = """
WITH done AS (SELECT point FROM points WHERE run_id = $run AND status = 'done'),
agg AS (
    SELECT s.example_id,
           sum(s.gnq) AS gnq_total, max(s.gnq) AS gnq_max, avg(s.gnq) AS gnq_mean,
           arg_max(s.gnq, s.point) AS gnq_last, arg_max(s.loss, s.point) AS loss_last,
           arg_max(s.self_influence, s.point) AS self_influence_last,
           arg_max(s.min_k_plus, s.point) AS min_k_plus,
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
secret_rows AS (  -- each attacked value, partly = PARTLY_LEAKED_SQL (attacks/secret_attack.py)
    SELECT *, NOT extracted AND """ + PARTLY_LEAKED_SQL + """ AS partly,
           2.0 * CAST(extracted AS INTEGER) + CAST(NOT extracted AND """ + PARTLY_LEAKED_SQL + """ AS INTEGER)
               + chars_reproduced / greatest(chars, 1) AS severity
    FROM secret_attacks WHERE run_id = $run),
secret_attack AS (  -- per text: how many of its values leaked, and the most exposed one's counts
    SELECT example_id, bool_or(extracted) AS secret_reproduced,
           CAST(count(*) AS INTEGER) AS secret_values_attacked,
           CAST(count(*) FILTER (WHERE extracted) AS INTEGER) AS secret_values_leaked,
           CAST(count(*) FILTER (WHERE partly) AS INTEGER) AS secret_values_partly,
           string_agg(generated, ' | ' ORDER BY secret_start) AS secret_generated
    FROM secret_rows GROUP BY example_id),
secret_exposure AS (  -- per text its most exposed measured value (exposed first, then the most bits):
    -- its exposure, estimated or not, threshold and reference come from that one value, named
    SELECT example_id, kind AS secret_exposure_kind, value AS secret_exposure_value,
           exposure AS secret_exposure, exposed AS secret_exposed,
           exposure_method = 'estimated' AS secret_exposure_estimated,
           reference_exposure AS secret_reference_exposure, exposure_null_p99 AS secret_exposure_null_p99
    FROM secret_rows WHERE exposure IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY example_id
                               ORDER BY coalesce(exposed, FALSE) DESC, exposure DESC, secret_start) = 1),
secret_shown AS (  -- the text's most exposed value (leaked, else partly, else the most characters)
    SELECT example_id, kind AS secret_kind, value AS secret_value, generated AS secret_value_generated,
           chars AS secret_chars,
           chars_reproduced AS secret_chars_reproduced,
           reference_chars_reproduced AS reference_secret_chars_reproduced,
           free_chars AS secret_free_chars, novel_chars_reproduced AS secret_free_chars_reproduced,
           free_null_mean AS secret_free_null_mean
    FROM secret_rows
    QUALIFY row_number() OVER (PARTITION BY example_id ORDER BY severity DESC, secret_start) = 1),
membership AS (
    SELECT example_id, """ + ", ".join(
    f"max(value) FILTER (WHERE metric = '{m}') AS {m}" for m in MEMBERSHIP_METRICS) + """
    FROM example_metrics WHERE run_id = $run GROUP BY example_id),
totals AS (
    SELECT e.example_id, e.text, e.grp AS "group", e.n_tokens,
           a.gnq_total, a.gnq_max, a.gnq_last, a.gnq_mean, a.loss_last, a.self_influence_last,
           a.min_k_plus, a.n_points,
           CAST(rank() OVER (ORDER BY a.gnq_total DESC NULLS LAST) AS INTEGER) AS gnq_rank,
           100.0 * cume_dist() OVER (ORDER BY a.gnq_total ASC NULLS FIRST) AS gnq_percentile,
           e.copies, e.cluster_id, c.gnq_with_copy,
           e.secret, e.secret_start, e.secret_end, e.secret_match, e.secret_values, e.public,
           x.match_fraction AS extraction_match, x.reference_match,
           x.success AS reproduced,
           x.success AND NOT coalesce(x.reference_match >= x.threshold, FALSE) AS extracted,
           x.generated_text AS extraction_generated, x.prefix_tokens AS attack_prefix_tokens,
           x.suffix_tokens AS attack_suffix_tokens, x.turn AS attack_turn,
           x.turn_trained AS attack_turn_trained,
           x.target_text AS extraction_target, e.turns,
           sa.secret_reproduced, sa.secret_values_attacked, sa.secret_values_leaked, sa.secret_values_partly,
           ss.secret_kind, ss.secret_value, ss.secret_value_generated,
           CAST(ss.secret_chars AS INTEGER) AS secret_chars,
           CAST(ss.secret_chars_reproduced AS INTEGER) AS secret_chars_reproduced,
           CAST(ss.reference_secret_chars_reproduced AS INTEGER) AS reference_secret_chars_reproduced,
           CAST(ss.secret_free_chars AS INTEGER) AS secret_free_chars,
           CAST(ss.secret_free_chars_reproduced AS INTEGER) AS secret_free_chars_reproduced,
           ss.secret_free_null_mean,
           se.secret_exposure, se.secret_exposed, se.secret_exposure_estimated, se.secret_exposure_kind,
           se.secret_exposure_value, se.secret_reference_exposure, se.secret_exposure_null_p99,
           sa.secret_generated,
           """ + ", ".join(f"m.{m}" for m in MEMBERSHIP_METRICS) + """
    FROM examples e
    LEFT JOIN agg a USING (example_id)
    LEFT JOIN copy_batches c USING (example_id)
    LEFT JOIN latest_attack x USING (example_id)
    LEFT JOIN membership m USING (example_id)
    LEFT JOIN secret_attack sa USING (example_id)
    LEFT JOIN secret_shown ss USING (example_id)
    LEFT JOIN secret_exposure se USING (example_id)
    WHERE e.run_id = $run)
"""
