"""DuckDB connections to the DuckLake catalog, with offline extensions and retries.

DuckLake lets several processes (a collecting flow, the dashboard, a SQL shell) use one warehouse
at once: each process holds its own in-memory DuckDB with the lake ATTACHed as ``lake``.
The SQLite catalog can answer ``database is locked`` under contention and DuckLake can report a
commit conflict; both are retried here with exponential backoff and jitter, so callers see an
error only when contention outlasts the retry budget.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import duckdb

from warehouse.config import WarehouseConfig, redact
from warehouse.extensions import connect_config
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
            target = "ducklake:sqlite:" + cfg.catalog
        else:
            target = "ducklake:postgres:" + cfg.catalog
        if cfg.is_local_data and not read_only:
            created += _mkdirs(Path(cfg.data_path))
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
        con.execute(f"USE {LAKE}")
        if sandboxed:
            sandbox(con, cfg)
    except BaseException:
        con.close()
        _remove_created(created)
        raise
    return con


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


# -- SQL written by people: a sandboxed connection and a statement guard ------------------------

#: Statement types :func:`run_user_sql` runs read-only, and the ones ``write=True`` adds.
#: Everything else (ATTACH, DETACH, COPY, EXPORT, IMPORT, INSTALL/LOAD, SET/RESET/USE, PRAGMA,
#: PREPARE/EXECUTE) is refused in both modes.
READ_STATEMENTS = frozenset({"SELECT", "EXPLAIN"})
WRITE_STATEMENTS = frozenset(
    {"INSERT", "UPDATE", "DELETE", "MERGE_INTO", "CREATE", "DROP", "ALTER", "TRANSACTION", "CALL"}
)
# DuckLake functions that only read (the others expire, clean up, rewrite or add files).
_LAKE_READ_FUNCTIONS = frozenset(
    {
        "ducklake_current_snapshot",
        "ducklake_last_committed_snapshot",
        "ducklake_list_files",
        "ducklake_options",
        "ducklake_snapshots",
        "ducklake_table_changes",
        "ducklake_table_deletions",
        "ducklake_table_info",
        "ducklake_table_insertions",
    }
)
# Core functions that run SQL given as text or a serialized plan (would bypass the guard).
_SQL_TEXT_FUNCTIONS = frozenset({"query", "query_table", "json_execute_serialized_sql"})


class SqlRefusedError(WarehouseError):
    """User SQL that the sandbox does not run; the message says what and why."""


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


def parse_statements(query: str) -> list[duckdb.Statement]:
    """Parse ``query`` without touching files (``IMPORT DATABASE`` reads files while parsing)."""
    con = duckdb.connect(config={"enable_external_access": False})
    try:
        return con.extract_statements(query)
    finally:
        con.close()


def check_user_sql(
    con: duckdb.DuckDBPyConnection, query: str, *, write: bool = False
) -> list[duckdb.Statement]:
    """The statements of ``query`` if :func:`run_user_sql` may run them, else raise
    :class:`SqlRefusedError` (or ``duckdb.ParserException`` for SQL that does not parse)."""
    statements = parse_statements(query)
    if not statements:
        raise SqlRefusedError("the query is empty")
    allowed = READ_STATEMENTS | (WRITE_STATEMENTS if write else frozenset())
    refused = [s.type.name for s in statements if s.type.name not in allowed]
    if refused:
        kinds = ", ".join(dict.fromkeys(refused))
        why = (
            "only SELECT, EXPLAIN and data changes (INSERT, UPDATE, DELETE, MERGE, CREATE, "
            "DROP, ALTER, CALL, transactions) run here: no files, attachments, extensions or "
            "settings"
            if write
            else "this SQL is read-only: only SELECT and EXPLAIN"
        )
        raise SqlRefusedError(f"refusing to run a {kinds} statement ({why})")
    denied = _denied_functions(con, write)
    called = sorted(f for f in _called_functions(query) if f in denied)
    if called:
        raise SqlRefusedError(
            f"refusing to call {', '.join(called)}: it reads outside the warehouse tables, "
            "runs SQL given as text, or changes the lake's files"
        )
    return statements


def run_user_sql(
    con: duckdb.DuckDBPyConnection, query: str, *, write: bool = False
) -> tuple[duckdb.DuckDBPyConnection | None, int]:
    """Run SQL written by a person on a :func:`sandbox`-ed connection, statement by statement.

    Returns the connection holding the last statement's result (``None`` for no statement) and
    the number of statements. Refusals raise :class:`SqlRefusedError` with the reason; DuckDB's
    own permission errors (a file outside the warehouse) are raised as one, too.
    """
    result = None
    statements = check_user_sql(con, query, write=write)
    for stmt in statements:
        refused = None
        try:
            result = con.execute(stmt)
        except duckdb.PermissionException as exc:
            refused = str(exc).splitlines()[0]
        if refused is not None:  # raised outside the except: a refusal, not an I/O failure
            raise SqlRefusedError(
                "refused: this reaches outside the warehouse (SQL here reads only the "
                f"warehouse's own tables): {refused}"
            )
    return result, len(statements)


def _called_functions(query: str) -> set[str]:
    """Names (lower case) of everything called in ``query``: a name followed by ``(``."""
    tokens = duckdb.tokenize(query)
    names = set()
    for (start, kind), (nxt, _) in itertools.pairwise(tokens):
        if kind not in (duckdb.token_type.identifier, duckdb.token_type.keyword):
            continue
        if not query[nxt:].startswith("("):
            continue
        text = query[start:nxt].strip()
        m = re.match(r'"((?:[^"]|"")*)"|([^\s(/-]+)', text)
        if m:
            names.add(
                (m.group(1).replace('""', '"') if m.group(1) is not None else m.group(2)).lower()
            )
    return names


@functools.cache
def _core_functions() -> frozenset[str]:
    con = duckdb.connect(config={"enable_external_access": False})
    try:
        return frozenset(
            r[0]
            for r in con.execute("SELECT DISTINCT function_name FROM duckdb_functions()").fetchall()
        )
    finally:
        con.close()


def _denied_functions(con: duckdb.DuckDBPyConnection, write: bool) -> frozenset[str]:
    """Functions added by extensions (sqlite, postgres, ducklake's file maintenance…) except the
    lake's read functions, plus the core functions that run SQL text."""
    present = {
        r[0]
        for r in con.execute("SELECT DISTINCT function_name FROM duckdb_functions()").fetchall()
    }
    extension = present - _core_functions()
    allowed = _LAKE_READ_FUNCTIONS | (
        {f for f in extension if f.startswith("ducklake_")} if write else frozenset()
    )
    return frozenset((extension - allowed) | _SQL_TEXT_FUNCTIONS)
