"""Writing a shards folder (``results.shards`` reads one): what every rank of a training run
writes, with pandas and pyarrow only, so the library's Trainer runs without the store's engine
(duckdb).  The folder's layout: ``results.shards``."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from gnq_core.common.atomic import atomic_path, write_text_atomic
from gnq_core.results.records import BatchResult, RunSpec, ScoreColumns, batch_frame
from gnq_core.results.store_schema import StoreError

__all__ = ["EXAMPLES_FILE", "FORMAT", "RUN_FILE", "SECRET_TRACKING_COLUMNS", "TRACKING_FILE", "ShardError",
           "ShardWriter", "digest_path", "file_digest", "new_shard_folder", "write_parquet", "write_run_file"]

RUN_FILE = "run.json"
EXAMPLES_FILE = "examples.parquet"
FORMAT = "gnq-shards/1"

# Secret values probed while training (integrations/tracking.py): the file beside the shards that
# gnq ingest loads into secret_tracking (migration 0014), and its columns after run_id.
TRACKING_FILE = "secret_tracking.parquet"
SECRET_TRACKING_COLUMNS = ["step", "example_id", "kind", "value", "chars", "chars_reproduced", "leaked",
                           "partly", "exposure", "exposure_method", "null_p99", "exposed", "seconds"]


def digest_path(path: Path) -> Path:
    """Where the sha256 of a Parquet file's bytes is kept: beside it, hidden (``.NAME.sha256``), so
    no ``*.parquet`` or ``rank-*`` glob takes it for a shard.  The reader refuses a file whose bytes
    changed since; a folder written before the digests is read as it was."""
    return path.with_name(f".{path.name}.sha256")


class ShardError(StoreError):
    """A shards folder that cannot be read or is incomplete."""


class ShardWriter:
    """Buffers one rank's records and writes them as one Parquet pair per step range."""

    def __init__(self, root: str | Path, rank: int = 0, world_size: int = 1) -> None:
        self.root = Path(root)
        self.rank, self.world_size = rank, world_size
        self._frames: dict[str, list[pd.DataFrame]] = {"scores": [], "batches": []}
        self._first_step: int | None = None
        self._last_step: int | None = None

    def add(self, step: int, point: int, texts: ScoreColumns, batches: Sequence[BatchResult]) -> None:
        """The records of one optimizer step at ``point`` (the epoch)."""
        self._frames["scores"].append(texts.frame(point))
        self._frames["batches"].append(batch_frame(batches, point))
        self._first_step = step if self._first_step is None else self._first_step
        self._last_step = step

    def flush(self) -> list[Path]:
        """Write what is buffered (every rank flushes at the same steps, even with no rows)."""
        if self._first_step is None:
            return []
        written = []
        for table, frames in self._frames.items():
            name = f"rank-{self.rank:05d}.steps-{self._first_step:08d}-{self._last_step:08d}.parquet"
            frame = pd.concat([f for f in frames if len(f)] or frames[:1], ignore_index=True)
            written.append(write_parquet(frame, self.root / table / name))
            frames.clear()
        self._first_step = self._last_step = None
        return written


def file_digest(path: Path) -> str:
    """sha256 (hex) of a file's bytes, read 1 MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_parquet(frame: pd.DataFrame, path: Path) -> Path:
    """The frame as a Parquet file, then its digest beside it (each written whole or not at all)."""
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False)
    write_text_atomic(digest_path(path), file_digest(path) + "\n")
    return path


def new_shard_folder(root: str | Path, run: RunSpec, examples: pd.DataFrame | None,
                     world_size: int) -> dict[str, Any]:
    """Rank 0 at the start of training: run.json (+ examples.parquet).  Refuses a used folder."""
    root = Path(root)
    if (root / RUN_FILE).exists():
        raise ShardError(f"{root}: already holds the shards of a run; give each training its own folder")
    meta = {"format": FORMAT, "world_size": world_size, "status": "running", "points": [],
            "run": asdict(run) | {"settings": run.settings | {"shard_id": uuid.uuid4().hex}}}
    if examples is not None:
        turns = ["turns"] if "turns" in examples.columns else []  # a chat text's layout (sources/chat.py)
        write_parquet(examples[["example_id", "text", "grp", "n_tokens", *turns]], root / EXAMPLES_FILE)
    write_run_file(root, meta)
    return meta


def write_run_file(root: str | Path, meta: dict[str, Any]) -> None:
    write_text_atomic(Path(root) / RUN_FILE, json.dumps(meta, indent=2, default=str) + "\n")
