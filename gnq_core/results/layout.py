"""The store folder's layout, in one place: what lives beside the DuckDB file.

    <folder>/gnq.duckdb          the store
    <folder>/jobs/               dashboard jobs: JOB.json, JOB.log, JOB.progress.json
    <folder>/uploads/JOB/        a job's uploaded files (deleted when the job ends)
    <folder>/kept-checkpoints/   the last audited checkpoint of an uploaded series (attacks need it)
    <folder>/demo-checkpoints/   the demo's checkpoints (gnq demo)
    <folder>/studies/            the studies' checkpoints and intermediate files (python -m research
                                 study; research/studies/base.py's studies_root)
    <folder>/companions/         a streamed companion set's first pass (A = SᵀS), until it is scored
"""

from __future__ import annotations

from pathlib import Path


def store_folder(db: str | Path) -> Path:
    return Path(db).resolve().parent


def jobs_dir(db: str | Path, create: bool = True) -> Path:
    d = store_folder(db) / "jobs"
    if create:
        d.mkdir(parents=True, exist_ok=True)
    return d


def uploads_root(db: str | Path) -> Path:
    return store_folder(db) / "uploads"


def kept_root(db: str | Path) -> Path:
    return store_folder(db) / "kept-checkpoints"


def demo_checkpoints(db: str | Path) -> Path:
    return Path(db).parent / "demo-checkpoints"


def companions_root(db: str | Path) -> Path:
    return store_folder(db) / "companions"
