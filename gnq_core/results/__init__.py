"""Results: the DuckDB store (it owns all SQL), the rows it holds, Parquet shards of
distributed runs, exports, and the layout of the store's folder."""

from gnq_core._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    ".export": ("FORMATS", "FORMULA_GUARD_NOTE", "ExportError", "export_frame", "guarded_cells", "to_bytes",
                "write_table"),
    ".layout": ("jobs_dir", "uploads_root"),
    ".records": ("MIN_BATCH_SIZE", "RunSpec", "ScoreColumns"),
    ".shards": ("ShardError", "ingest", "open_store"),
    ".store": ("Store", "default_db_path"),
    ".store_queries": ("Run",),
    ".store_schema": ("RunNotFoundError", "StoreError"),
})
