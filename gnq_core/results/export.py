"""Writing flagged texts to CSV, JSONL or Parquet, atomically (never a half-written file)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from gnq_core.atomic import atomic_path

FORMATS = ("csv", "jsonl", "parquet")


def write_table(frame: pd.DataFrame, path: str | Path, fmt: str) -> Path:
    """Write ``frame`` as ``fmt`` to ``path``, atomically."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r} (use {', '.join(FORMATS)})")
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path}: is a folder; give a file name for the export")
    with atomic_path(path) as tmp:
        if fmt == "csv":
            frame.to_csv(tmp, index=False)
        elif fmt == "jsonl":
            frame.to_json(tmp, orient="records", lines=True, force_ascii=False)
        else:
            frame.to_parquet(tmp, index=False)
    return path


def to_bytes(frame: pd.DataFrame, fmt: str) -> bytes:
    """The same formats in memory (the dashboard's download buttons)."""
    import io

    if fmt == "csv":
        return frame.to_csv(index=False).encode()
    if fmt == "jsonl":
        return frame.to_json(orient="records", lines=True, force_ascii=False).encode()
    if fmt == "parquet":
        buf = io.BytesIO()
        frame.to_parquet(buf, index=False)
        return buf.getvalue()
    raise ValueError(f"unknown format {fmt!r} (use {', '.join(FORMATS)})")


EXPORT_COLUMNS = ["example_id", "text", "group", "rank", "percentile", "status", "reason", "risk",
                  "gnq_total", "gnq_max", "gnq_last", "gnq_mean", "gnq_rank", "gnq_percentile",
                  "copies", "cluster_id", "gnq_with_copy", "secret", "secret_start", "secret_end",
                  "secret_match", "loss_last", "self_influence_last", "n_points"]
EXTRACTION_COLUMNS = ["extracted", "extraction_match", "reference_match", "extraction_generated",
                      "loss_ratio", "zlib_ratio", "min_k_prob"]


def export_frame(ranked: pd.DataFrame, with_extraction: bool) -> pd.DataFrame:
    """The exported columns, in a stable order (``ranked``: analysis.verdict.rank_texts's frame;
    ``rank`` and ``percentile`` are the verdict's, GNQ's own are ``gnq_rank`` / ``gnq_percentile``)."""
    cols = EXPORT_COLUMNS + (EXTRACTION_COLUMNS if with_extraction else [])
    return ranked[[c for c in cols if c in ranked.columns]].reset_index(drop=True)
