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
from warehouse.extensions import connect_config
from warehouse.objectstore import ObjectStoreError, S3Settings, split_url
from warehouse.retry import retrying
from warehouse.sqltext import sql_string

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


class NoWarehouseError(WarehouseError):
    """A read-only open found no warehouse (and created none); the message says how to make one."""


def connect(
    cfg: WarehouseConfig, *, read_only: bool = False, sandboxed: bool = False
) -> duckdb.DuckDBPyConnection:
    """Open an in-memory DuckDB with the warehouse ATTACHed as ``lake`` and selected by USE.

    ``read_only``: attach READ_ONLY and create nothing (no catalog file, no folders); a missing
    warehouse raises :class:`NoWarehouseError`. A failed open removes whatever it created.
    ``sandboxed``: for SQL written by people (``webloop sql``, a dashboard's SQL page): see
    :func:`sandbox`. Run such SQL with :func:`run_user_sql`.
    """
    if read_only:
        require_catalog_file(cfg)
    con = duckdb.connect(config=connect_config(extension_directory()))
    con.execute("SET parquet_metadata_cache = true")
    created: list[Path] = []  # what this call created, removed again if the open fails
    try:
        if cfg.catalog_kind == "sqlite":
            if not read_only:
                _prepare_sqlite(Path(cfg.catalog), created)
            target = attach_target(cfg)
        else:
            _catalog_secret(con, cfg)
            target = attach_target(cfg)  # no password: it is in the secret
        if cfg.is_local_data and not read_only:
            created += _mkdirs(Path(cfg.data_path))
        elif not cfg.is_local_data:
            _storage_secret(con, cfg)
        options = [f"DATA_PATH {sql_string(cfg.data_path)}"]
        if cfg.inline_row_limit:
            options.append(f"DATA_INLINING_ROW_LIMIT {int(cfg.inline_row_limit)}")
        if read_only:
            options.append("READ_ONLY")
        stmt = f"ATTACH {sql_string(target)} AS {LAKE} ({', '.join(options)})"
        missing = False
        try:
            with_retry(lambda: con.execute(stmt), what="attach")
        except duckdb.Error as exc:
            if not (read_only and "explicitly disabled" in str(exc)):
                raise WarehouseError(
                    f"cannot open the warehouse catalog {cfg.describe()}: "
                    f"{redact(str(exc), cfg.secret)}"
                ) from None
            missing = True  # an empty PostgreSQL catalog: DuckLake may not create one read-only
        if missing:
            raise NoWarehouseError(_no_warehouse(cfg))
        _use_lake(con, read_only)
        if sandboxed:
            sandbox(con, cfg)
    except BaseException:
        con.close()
        _remove_created(created)
        raise
    return con


def _use_lake(con: duckdb.DuckDBPyConnection, read_only: bool) -> None:
    """``USE lake``. After a ``DROP SCHEMA main CASCADE`` (undone by ``webloop warehouse
    rollback``) there is no schema to use: a writable open creates it again, a read-only one
    stays on the in-memory database (queries then say which table is missing)."""
    try:
        con.execute(f"USE {LAKE}")
    except duckdb.CatalogException:
        if read_only:
            return
        con.execute(f"CREATE SCHEMA IF NOT EXISTS {LAKE}.main")
        con.execute(f"USE {LAKE}")


def attach_target(cfg: WarehouseConfig) -> str:
    """The ``ducklake:…`` string that ATTACHes ``cfg``'s catalog (never with a password)."""
    kind = "sqlite" if cfg.catalog_kind == "sqlite" else "postgres"
    return f"ducklake:{kind}:{cfg.catalog}"


def _catalog_secret(con: duckdb.DuckDBPyConnection, cfg: WarehouseConfig) -> None:
    """Hand the PostgreSQL catalog's password to DuckDB as a temporary secret, so it is not in
    the ATTACH string that ``duckdb_databases()`` and ``PRAGMA database_list`` show;
    ``duckdb_secrets()`` shows a secret's name and scope, redacted."""
    if cfg.secret:
        con.execute(
            "CREATE OR REPLACE TEMPORARY SECRET webloop_catalog "
            f"(TYPE postgres, PASSWORD {sql_string(cfg.secret)})"
        )


def _storage_secret(con: duckdb.DuckDBPyConnection, cfg: WarehouseConfig) -> None:
    """Load httpfs and hand it the object store's settings and credentials as a temporary
    secret scoped to the data path's bucket (:mod:`warehouse.objectstore`): nothing of them is
    in the ATTACH string, the catalog, or ``duckdb_secrets()`` (redacted)."""
    try:
        settings = S3Settings.from_env()
        bucket, _ = split_url(cfg.data_path)
    except ObjectStoreError as exc:
        raise WarehouseError(f"data path {cfg.data_path}: {exc}") from None
    con.execute("LOAD httpfs")
    con.execute(settings.duckdb_secret_sql("webloop_storage", f"s3://{bucket}"))


def require_catalog_file(cfg: WarehouseConfig) -> None:
    """Raise :class:`NoWarehouseError` when ``cfg``'s SQLite catalog file does not exist (a
    cheap probe that creates nothing; an empty PostgreSQL catalog is found only by opening it)."""
    if cfg.catalog_kind == "sqlite" and not Path(cfg.catalog).is_file():
        raise NoWarehouseError(_no_warehouse(cfg))


def _no_warehouse(cfg: WarehouseConfig) -> str:
    return (
        f"no warehouse at {cfg.describe()} yet: create one with `webloop tasks generate` "
        "(or `webloop demo`), or point WEBLOOP_HOME / WEBLOOP_WAREHOUSE at an existing one"
    )


def _mkdirs(path: Path) -> list[Path]:
    """``mkdir -p path``; the folders it created, outermost first."""
    missing = [p for p in (path, *path.parents) if not p.exists()][::-1]
    path.mkdir(parents=True, exist_ok=True)
    return missing


def _remove_created(created: list[Path]) -> None:
    """Undo a failed open: the catalog file it created (if still empty of tables), its -wal and
    -shm files, and the folders it created (if empty), innermost first."""
    for path in reversed(created):
        try:
            if path.is_dir():
                path.rmdir()  # only if empty: never removes anything else
            elif path.is_file() and _sqlite_is_empty(path):
                for extra in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                    extra.unlink(missing_ok=True)
        except OSError:
            pass


def _sqlite_is_empty(path: Path) -> bool:
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
        try:
            return db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
        finally:
            db.close()
    except sqlite3.Error:
        return False


def _prepare_sqlite(path: Path, created: list[Path] | None = None) -> None:
    """Create the catalog file's folder and switch it to WAL (persists in the file); add the
    folders and file this creates to ``created``.

    Without WAL a writer starves readers; WAL lets the dashboard read while a flow writes.
    """
    created = created if created is not None else []
    created += _mkdirs(path.parent)
    if not path.exists():
        created.append(path)

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


# -- SQL written by people: the sandboxed connection (the checks: warehouse.usersql) ---------


def sandbox(con: duckdb.DuckDBPyConnection, cfg: WarehouseConfig) -> None:
    """Lock ``con`` (already ATTACHed to the lake) to the warehouse.

    DuckDB's ``enable_external_access = false`` with ``allowed_directories`` set to the data
    path: the lake's Parquet files (and the catalog DuckDB attached) stay readable, any other
    file, URL or database cannot be opened, read, written or attached, and extensions cannot be
    installed or loaded. ``lock_configuration`` then refuses any SET that would undo it. Storage
    extensions (sqlite, postgres) do not obey these settings: their functions are refused by
    :func:`run_user_sql`, which is how user SQL must be run.
    """
    if not cfg.is_local_data:  # remote data files need httpfs, loaded before loading is off
        con.execute("LOAD httpfs")
    con.execute("SET python_enable_replacements = false")  # no scans of Python variables
    con.execute("SET temp_directory = ''")  # no spill folder that SQL could read or write
    con.execute(f"SET allowed_directories = [{sql_string(cfg.data_path)}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
