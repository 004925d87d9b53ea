"""DuckDB connections to the DuckLake catalog, with offline extensions and retries.

DuckLake lets several processes (a collecting flow, the dashboard, a SQL shell) use one warehouse
at once: each process holds its own in-memory DuckDB with the lake ATTACHed as ``lake``.
The SQLite catalog can answer ``database is locked`` under contention and DuckLake can report a
commit conflict; both are retried here with exponential backoff and jitter, so callers see an
error only when contention outlasts the retry budget.
"""

from __future__ import annotations

import importlib.util
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import duckdb

from warehouse.config import WarehouseConfig, redact
from warehouse.retry import retrying

T = TypeVar("T")

LAKE = "lake"
_TRANSIENT = (
    "database is locked",
    "database is busy",
    "database table is locked",
    "conflict",
    "could not serialize",
    "deadlock detected",
    "failed to commit",
    "could not commit",
    "unique constraint failed",  # two writers racing for the same new snapshot id
    "duplicate key value",  # same race on a PostgreSQL catalog
)


class WarehouseError(RuntimeError):
    """A warehouse operation failed; the message says what and where."""


def extension_directory() -> str:
    """The folder holding the signed DuckDB extensions shipped by the ``duckdb-ext-*`` wheels."""
    spec = importlib.util.find_spec("duckdb_ext")
    if spec is None or not spec.submodule_search_locations:
        raise WarehouseError(
            "DuckDB extensions are not installed: pip install duckdb-ext-ducklake "
            "duckdb-ext-sqlite duckdb-ext-postgres (see pyproject.toml)"
        )
    return str(Path(next(iter(spec.submodule_search_locations))) / "extensions")


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` is contention that a retry can clear (lock, commit conflict)."""
    msg = str(exc).lower()
    return isinstance(exc, duckdb.Error) and any(s in msg for s in _TRANSIENT)


def with_retry(
    fn: Callable[[], T],
    *,
    what: str,
    attempts: int = 30,
    base_delay: float = 0.02,
    max_delay: float = 1.0,
    on_retry: Callable[[], None] | None = None,
) -> T:
    """Run ``fn``, retrying transient contention errors with jittered exponential backoff
    (:mod:`warehouse.retry`); any other error, or the last one, is raised as it is."""
    policy = retrying(
        attempts=attempts,
        retry_on=is_transient,
        base_delay=base_delay,
        max_delay=max_delay,
        on_retry=on_retry,
    )
    return policy(fn)


def sql_string(value: str) -> str:
    """Quote a string literal for the few statements that take no parameters (ATTACH options).

    Only configuration (paths, connection strings) goes through here, never row values.
    """
    return "'" + value.replace("'", "''") + "'"


def connect(cfg: WarehouseConfig, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open an in-memory DuckDB with the warehouse ATTACHed as ``lake`` and selected by USE."""
    con = duckdb.connect(
        config={
            "extension_directory": extension_directory(),
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": True,
        }
    )
    con.execute("SET parquet_metadata_cache = true")
    if cfg.catalog_kind == "sqlite":
        _prepare_sqlite(Path(cfg.catalog))
        target = "ducklake:sqlite:" + cfg.catalog
    else:
        target = "ducklake:postgres:" + cfg.catalog
    if cfg.is_local_data:
        Path(cfg.data_path).mkdir(parents=True, exist_ok=True)
    options = [f"DATA_PATH {sql_string(cfg.data_path)}"]
    if cfg.inline_row_limit:
        options.append(f"DATA_INLINING_ROW_LIMIT {int(cfg.inline_row_limit)}")
    if read_only:
        options.append("READ_ONLY")
    stmt = f"ATTACH {sql_string(target)} AS {LAKE} ({', '.join(options)})"
    try:
        with_retry(lambda: con.execute(stmt), what="attach")
    except duckdb.Error as exc:
        con.close()
        raise WarehouseError(
            f"cannot open the warehouse catalog {cfg.describe()}: {redact(str(exc), cfg.secret)}"
        ) from None
    con.execute(f"USE {LAKE}")
    return con


def _prepare_sqlite(path: Path) -> None:
    """Create the catalog file's folder and switch it to WAL (persists in the file).

    Without WAL a writer starves readers; WAL lets the dashboard read while a flow writes.
    """
    path.parent.mkdir(parents=True, exist_ok=True)

    def to_wal() -> None:
        db = sqlite3.connect(path, timeout=10)
        try:
            if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                db.execute("PRAGMA journal_mode=WAL")
        finally:
            db.close()

    locked = retrying(
        attempts=50,
        retry_on=lambda e: isinstance(e, sqlite3.OperationalError) and "locked" in str(e),
        base_delay=0.075,
        factor=1.0,
    )
    try:
        locked(to_wal)
    except sqlite3.OperationalError as exc:
        raise WarehouseError(f"cannot prepare SQLite catalog {path}: {exc}") from None
