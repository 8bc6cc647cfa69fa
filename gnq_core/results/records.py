"""The results contract (DESIGN.md §6): texts' score rows, one batch's result, and their run.

Every producer (``gnq train``, ``gnq audit``, the Trainer integration and its shards) builds
these records: ``batch_results`` builds a batch's score rows as ``ScoreColumns`` (numpy columns,
no object per text); ``ScoreColumns.frames`` / ``batch_frame`` are the one place they become
table rows, for the DuckDB store (``Store.write_point``) and for Parquet shards (``ShardWriter``)
alike.

A new per-text column: a migration adds it to the ``scores`` table, the producer passes it in
``extra`` (``{"column": values}``); rows are inserted by column name, so neither the writers nor
the other producers change (a text without the value gets NULL).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:  # the results layer never imports torch (the dashboard reads it)
    import torch

    Floats = Sequence[float] | np.ndarray | torch.Tensor  # per-text values, as the engine hands them

SCORE_COLUMNS = ["example_id", "batch_index", "step", "gnq", "loss", "self_influence"]
BATCH_COLUMNS = ["batch_index", "step", "size", "condition", "finite", "seconds", "gnq_mode", "sketch_k",
                 "sketch_seed"]
WRITE_CHUNK = 100_000  # score rows per frame when ScoreColumns are written
MIN_BATCH_SIZE = 2  # GNQ_j compares example j with the others of its batch (Σ_{k≠j}): B = 1 has none


@dataclass(frozen=True)
class BatchResult:
    """One GNQ batch: its size, the condition number of K + λI, whether it was finite, its time,
    and how K was formed: ``gnq_mode`` "exact", or "sketch" with its dimension per matrix and
    seed (``engine.sketch``; DESIGN.md §9)."""

    batch_index: int
    step: int | None
    size: int
    condition: float | None
    finite: bool
    seconds: float
    gnq_mode: str = "exact"
    sketch_k: int | None = None
    sketch_seed: int | None = None


def batch_results(example_ids: Sequence[int] | np.ndarray | torch.Tensor, losses: Floats,
                  gnq: Floats | None, self_influence: Floats | None, *, batch_index: int, step: int | None,
                  condition: float | None, finite: bool, seconds: float,
                  size: int | None = None, extra: Mapping[str, Floats] | None = None,
                  scored: Sequence[bool] | np.ndarray | torch.Tensor | None = None, gnq_mode: str = "exact",
                  sketch_k: int | None = None, sketch_seed: int | None = None
                  ) -> tuple[ScoreColumns, BatchResult]:
    """The records of one batch, the one score-row builder: the texts' rows as columns (numpy,
    straight from the engine's tensors: no object per text) and the batch's ``BatchResult``.
    ``gnq``/``self_influence`` None when it was not finite; all three scores NaN (NULL) for a
    text not ``scored`` (too short to have a next token).  ``size`` defaults to the number of
    texts (a global batch of several ranks is larger); ``extra``: further per-text columns, one
    value per text, by name."""
    ids = _array(example_ids, np.int64)
    n = len(ids)
    columns = ScoreColumns(n, tuple(extra or ()))
    columns.example_id[:n], columns.batch_index[:n] = ids, batch_index
    columns.step[:n], columns.step_missing[:n] = 0 if step is None else step, step is None
    for j, values in enumerate((gnq, losses, self_influence, *(extra or {}).values())):
        columns.values[:n, j] = math.nan if values is None else _array(values, np.float64)
    if scored is not None:
        columns.values[:n, :3][~_array(scored, bool)] = math.nan
    columns.n = n
    return columns, BatchResult(batch_index, step, n if size is None else size, condition, finite, seconds,
                                gnq_mode, sketch_k, sketch_seed)


def _array(values: Floats | Sequence[Any], dtype: type) -> np.ndarray:
    if hasattr(values, "detach"):  # a tensor, as the engine hands it over
        values = values.detach().cpu()
        return (values.double() if dtype is np.float64 else values).numpy().astype(dtype, copy=False)
    return np.asarray(values, dtype)


class ScoreColumns:
    """Score rows as numpy columns, filled batch by batch: about 50 bytes a text, so a point of
    millions of texts stays small.  ``Store.write_point`` and ``ShardWriter`` take them and
    ``frames`` makes the typed ``scores`` rows, in chunks.  ``extra``: the names of further
    float columns every row carries (the forward signals); NaN is NULL."""

    _FIXED = ("gnq", "loss", "self_influence")

    def __init__(self, capacity: int = 1024, extra: Sequence[str] = ()) -> None:
        self.n = 0
        capacity = max(int(capacity), 1)
        self._floats = (*self._FIXED, *extra)
        self.extra = tuple(extra)
        self.example_id = np.empty(capacity, np.int64)
        self.batch_index = np.empty(capacity, np.int64)
        self.step = np.empty(capacity, np.int64)
        self.step_missing = np.empty(capacity, bool)
        self.values = np.empty((capacity, len(self._floats)), np.float64)  # gnq, loss, K_jj, extra; NaN: None

    def __len__(self) -> int:
        return self.n

    _COLUMNS = ("example_id", "batch_index", "step", "step_missing", "values")

    def column(self, name: str) -> np.ndarray:
        """One float column's values (``gnq``, ``loss``, ``self_influence`` or an extra), a view."""
        return self.values[: self.n, self._floats.index(name)]

    def add(self, other: ScoreColumns) -> None:
        """Append ``other``'s rows (its extra columns by name: the same names, any order)."""
        if set(other.extra) != set(self.extra):
            raise ValueError(f"every row needs exactly the extra columns {list(self.extra)}")
        k = other.n
        if self.n + k > len(self.example_id):  # grow geometrically
            size = max(2 * len(self.example_id), self.n + k)
            for name in self._COLUMNS:
                old = getattr(self, name)
                new = np.empty((size, *old.shape[1:]), old.dtype)
                new[: self.n] = old[: self.n]
                setattr(self, name, new)
        rows = slice(self.n, self.n + k)
        for name in self._COLUMNS[:-1]:
            getattr(self, name)[rows] = getattr(other, name)[:k]
        self.values[rows] = other.values[:k, [other._floats.index(c) for c in self._floats]]
        self.n += k

    @classmethod
    def joined(cls, parts: Sequence[ScoreColumns]) -> ScoreColumns:
        """Several ranks' columns as one, ordered by batch index (stable: a batch's texts keep
        their order)."""
        out = cls(sum(len(p) for p in parts), parts[0].extra if parts else ())
        for part in parts:
            out.add(part)
        if np.any(np.diff(out.batch_index[: out.n]) < 0):
            keep = np.argsort(out.batch_index[: out.n], kind="stable")
            for name in out._COLUMNS:
                setattr(out, name, getattr(out, name)[keep])
        return out

    def frames(self, point: int, chunk: int | None = None) -> Iterator[pd.DataFrame]:
        """The typed ``scores`` rows (all columns but run_id; extra ones after the fixed ones),
        ``chunk`` (default ``WRITE_CHUNK``) rows at a time (one empty frame when there are none)."""
        chunk = chunk or WRITE_CHUNK
        for start in range(0, max(self.n, 1), chunk):
            rows = slice(start, min(start + chunk, self.n))
            yield pd.DataFrame({
                "point": np.full(rows.stop - rows.start, point, np.int64),
                "example_id": self.example_id[rows].copy(), "batch_index": self.batch_index[rows].copy(),
                "step": pd.arrays.IntegerArray(self.step[rows].copy(), self.step_missing[rows].copy()),
                **{c: self.values[rows, j].copy() for j, c in enumerate(self._floats)}})

    def frame(self, point: int) -> pd.DataFrame:
        """All the rows as one typed frame (``frames`` in one chunk)."""
        return next(self.frames(point, chunk=max(self.n, 1)))


def batch_frame(batches: Sequence[BatchResult], point: int) -> pd.DataFrame:
    """``batches`` rows (all columns but run_id), typed."""
    frame = pd.DataFrame([{"point": point} | asdict(b) for b in batches], columns=["point", *BATCH_COLUMNS])
    return frame.astype({"point": "int64", "batch_index": "int64", "step": "Int64", "size": "int64",
                         "condition": "float64", "finite": "bool", "seconds": "float64",
                         "gnq_mode": "string", "sketch_k": "Int64", "sketch_seed": "Int64"})


def check_gnq_settings(lam: float, batch_size: int) -> None:
    """The one rule for a GNQ run's λ and batch size (DESIGN.md §1)."""
    if not (math.isfinite(float(lam)) and float(lam) > 0):
        raise ValueError(f"λ (--lam) must be a finite number > 0, got {lam}")
    if int(batch_size) != batch_size or batch_size < MIN_BATCH_SIZE:
        raise ValueError(f"the batch size must be a whole number ≥ {MIN_BATCH_SIZE} (GNQ compares each text "
                         f"with the others of its batch), got {batch_size}")


@dataclass(frozen=True)
class RunSpec:
    """What produced a run's results: the ``runs`` row, validated when built.

    ``settings`` holds the producer's further settings; on a rerun every key stored with the run
    must match (``growing`` keys may have grown: a checkpoint series that went on).
    """

    name: str
    kind: str  # train | audit
    lam: float
    batch_size: int
    seed: int
    max_length: int
    model_path: str
    dataset_path: str
    dataset_hash: str
    n_examples: int
    code_version: str
    model_hash: str | None = None
    device: str | None = None
    dtype: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    loss: str = "token_mean"  # ℓ_j's convention (engine/math/losses.py); the runs row states it in words

    def __post_init__(self) -> None:
        check_gnq_settings(self.lam, self.batch_size)  # max_length is only recorded here (0: unknown)


_CORE = ("lam", "batch_size", "seed", "max_length")  # runs columns
_LABELS = {"checkpoints": "checkpoint series", "init": "--init"}


def resume_mismatches(stored: Any, spec: RunSpec, *, ignore: Sequence[str] = ("device",),
                      growing: Sequence[str] = ("checkpoints",)) -> list[str]:
    """What differs between a stored run (``store_queries.Run``) and the spec of its rerun."""
    found = [] if stored.dataset_hash == spec.dataset_hash else ["dataset content"]
    pairs = [(k, getattr(stored, k), getattr(spec, k)) for k in _CORE] + [
        (k, stored.settings[k], list(v) if isinstance(v, tuple) else v) for k, v in spec.settings.items()
        if k in stored.settings and k not in (*_CORE, *ignore)]
    for key, old, new in pairs:
        if key in growing and isinstance(old, list) and isinstance(new, list):
            same = [str(v) for v in new[:len(old)]] == [str(v) for v in old]
        else:
            same = old == new
        if not same:
            found.append(f"{_LABELS.get(key, key)} ({_show(old)} stored, {_show(new)} given)")
    return found


def _show(value: Any) -> str:
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)
