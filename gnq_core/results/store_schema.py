"""The store's schema: its migrations (migrations/NNNN_*.sql), the version a file is at, applying
what is pending, and the store's errors."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from gnq_core.errors import GNQError

if TYPE_CHECKING:  # duckdb is imported where a function uses it: StoreError and the shard writer
    import duckdb  # (results.shard_files, the library's Trainer) must not need the store's engine

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
# A chat text's layout (sources/chat.py ChatLayout.to_json: turns, trained tokens, template spans)
TURNS_COLUMN = "turns"

# Per-text properties of the text within its dataset (sources/copies.py, sources/secrets.py).
TEXT_LABEL_COLUMNS = ["copies", "cluster_id", "secret", "secret_start", "secret_end", "secret_match",
                      "secret_values", "public"]

# A secret-like value "partly leaked": not all of its letters and digits came out, but at least
# PARTLY_MIN_CHARS of its free part (novel_chars_reproduced: the characters neither the run's
# template, as "+44 20 7946" of every phone number of a data set, nor its kind's format fixes), more
# than a never-trained value of the same kind and template matches of the same writing
# (free_null_p <= PARTLY_NULL_P: attacks/partial_leak.py), and more characters than the reference
# model wrote.  Rows attacked before schema 15 (free_null_p NULL) keep the rule they were stored
# under: at least a quarter of the characters too.
PARTLY_MIN_CHARS, PARTLY_MIN_SHARE, PARTLY_NULL_P = 3, 0.25, 0.01
PARTLY_LEAKED_SQL = (f"(coalesce(novel_chars_reproduced, chars_reproduced) >= {PARTLY_MIN_CHARS} AND "
                     f"CASE WHEN free_null_p IS NULL THEN chars_reproduced >= {PARTLY_MIN_SHARE} * chars "
                     f"ELSE free_null_p <= {PARTLY_NULL_P} END AND "
                     "chars_reproduced > coalesce(reference_chars_reproduced, -1))")


def partly_leaked(chars: int, hits: int, reference_hits: int | None, novel_hits: int | None = None,
                  null_p: float | None = None) -> bool:
    """``PARTLY_LEAKED_SQL`` for one value that did not come out whole."""
    novel = hits if novel_hits is None else novel_hits
    beyond_chance = hits >= PARTLY_MIN_SHARE * chars if null_p is None else null_p <= PARTLY_NULL_P
    return (hits < chars and novel >= PARTLY_MIN_CHARS and beyond_chance
            and hits > (-1 if reference_hits is None else reference_hits))


class StoreError(GNQError, RuntimeError):
    """The store cannot be used (not a DuckDB file, newer schema, busy for too long...)."""


class RunNotFoundError(StoreError):
    pass


def migrations() -> list[tuple[int, Path]]:
    """(version, file) for every migration, in order; the version is the file's number."""
    return [(int(path.name.split("_", 1)[0]), path) for path in sorted(MIGRATIONS_DIR.glob("*.sql"))]


SCHEMA_VERSION = migrations()[-1][0]


def timestamp() -> datetime:
    """The time the store records (created, updated, heartbeat), to the second."""
    return datetime.now().replace(microsecond=0)


def _tables(con: duckdb.DuckDBPyConnection) -> frozenset[str]:
    return frozenset(r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall())


def current_version(con: duckdb.DuckDBPyConnection, path: Path) -> int:
    tables = _tables(con)
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


def apply_migrations(con: duckdb.DuckDBPyConnection, current: int, target: int | None = None) -> None:
    """Apply every pending migration, recording each in schema_version, in one transaction: a
    migration that fails (a damaged store missing a table it alters) leaves the store as it was."""
    pending = [(v, p) for v, p in migrations() if v > current and (target is None or v <= target)]
    if not pending:
        return
    with atomically(con):
        for version, path in pending:
            if version == 1:
                con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, "
                            "applied_at TIMESTAMP NOT NULL)")
            con.execute(path.read_text(encoding="utf-8"))
            con.execute("INSERT INTO schema_version VALUES (?, ?)", [version, timestamp()])


@functools.cache
def tables_at(version: int) -> frozenset[str]:
    """The tables a store at schema ``version`` has (its migrations applied to an empty database)."""
    import duckdb

    con = duckdb.connect(":memory:")
    try:
        apply_migrations(con, 0, version)
        return _tables(con)
    finally:
        con.close()


def check_tables(con: duckdb.DuckDBPyConnection, path: Path, version: int) -> None:
    """Refuse, before a migration writes anything, a store missing a table its version has."""
    if missing := sorted(tables_at(version) - _tables(con)):
        raise StoreError(f"{path}: a damaged store: schema {version} but no table {', '.join(missing)}; "
                         "left as it was (restore it from a copy, or use a new --db)")


@contextlib.contextmanager
def atomically(con: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    import duckdb

    con.execute("BEGIN TRANSACTION")
    try:
        yield con
    except BaseException:
        with contextlib.suppress(duckdb.Error):  # a failed write may have aborted it already
            con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
