"""Results: the DuckDB store (it owns every SQL statement), shards and exports."""
