"""SQL written by people (``webloop sql``, the dashboard's SQL page): what may run, and how it runs.

An **allow-list**, not a deny-list. Read-only SQL runs only what is known to read the warehouse:

* statements: ``SELECT`` (with ``WITH``, ``VALUES``, ``DESCRIBE``, ``SUMMARIZE``, ``SHOW TABLES``)
  and plain ``EXPLAIN`` of one (never ``EXPLAIN ANALYZE``, which executes its statement);
* checked on DuckDB's own parse tree (``json_serialize_sql``), so comments, quoting, case and
  non-ASCII text cannot hide anything from the check;
* every function called is on a vetted allow-list (:mod:`warehouse.sqlfunctions`: pure
  functions of their arguments), every table function one of :data:`TABLE_FUNCTIONS` (ranges,
  JSON unnesting, the lake's read-only snapshot functions), and every table a table of the lake
  (or a CTE of the query, or ``information_schema.tables`` / ``.columns``); a lake view is
  read only when its own stored SQL passes the same check;
* then **bound**: DuckDB plans the statement (``EXPLAIN``, which runs nothing) and every operator
  of the plan that reads or writes data must be the lake's (``DUCKLAKE_SCAN``,
  ``DUCKLAKE_INSERT``…) or an allowed table function: the catalog database
  (``__ducklake_metadata_lake``), ``system``, ``temp``, ``memory`` and anything attached are
  refused whatever the SQL text looked like (a view, a string named like a system view).

``write=True`` (``webloop sql --write``) adds the data statements (INSERT, UPDATE, DELETE,
MERGE, transactions); ``schema=True`` adds CREATE, DROP and ALTER. DuckDB serialises only
SELECT statements, so write statements are checked on DuckDB's token stream (every name called
must be an allowed function; no name may be a system view such as ``duckdb_databases``, nor
another catalog than the lake) and then bound like SELECT: their plan may touch the lake only.

Each query runs on a fresh connection (a cursor of the sandboxed one: temporary objects die
with it), with a time limit and Ctrl-C that interrupt DuckDB (``interrupt()``). The sandboxed
connection (:func:`warehouse.connection.sandbox`) stays the second layer: external access off,
the data folder the only allowed directory, configuration locked.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import duckdb

from warehouse.connection import WarehouseError
from warehouse.sqlfunctions import VETTED_CATEGORIES, VETTED_UNCATEGORIZED, WINDOW_FUNCTIONS

T = TypeVar("T")

LAKE = "lake"
DEFAULT_TIMEOUT_S = 120.0

#: Table functions read-only SQL may call (name, lower case): generators and JSON unnesting.
TABLE_FUNCTIONS = frozenset(
    {"range", "generate_series", "unnest", "json_each", "json_tree", "repeat", "summary"}
)
#: The lake's read-only functions, called as ``ducklake_x('lake', …)``.
LAKE_FUNCTIONS = frozenset(
    {
        "ducklake_snapshots",
        "ducklake_table_info",
        "ducklake_current_snapshot",
        "ducklake_last_committed_snapshot",
        "ducklake_options",
        "ducklake_list_files",
        "ducklake_table_changes",
        "ducklake_table_insertions",
        "ducklake_table_deletions",
    }
)
#: ... and as ``lake.x()``.
LAKE_METHODS = frozenset(
    {"snapshots", "table_info", "current_snapshot", "last_committed_snapshot", "options"}
)
#: The plan operators of the allowed table functions (DuckDB names them in upper case).
_TABLE_FUNCTION_OPERATORS = frozenset(n.upper() for n in TABLE_FUNCTIONS | LAKE_FUNCTIONS)
#: Plan operators that produce rows without reading a table (``VALUES``, CTEs, constants).
ROWLESS_SOURCES = frozenset(
    {"DUMMY_SCAN", "COLUMN_DATA_SCAN", "EMPTY_RESULT", "CTE_SCAN", "REC_CTE_SCAN", "DELIM_SCAN"}
    | {"CHUNK_SCAN", "EXPRESSION_SCAN", "RECURSIVE_CTE_SCAN", "CROSS_PRODUCT"}
)
#: The system tables ``information_schema.tables`` / ``.columns`` and ``SHOW TABLES`` read.
SCHEMA_LISTINGS = frozenset({"DUCKDB_TABLES", "DUCKDB_VIEWS", "DUCKDB_COLUMNS"})
#: Words of a plan operator that writes (to be allowed, it must be the lake's: ``DUCKLAKE_…``).
_WRITES = re.compile(r"INSERT|UPDATE|DELETE|MERGE|COPY|CREATE|DROP|ALTER|ATTACH|EXPORT|VACUUM")
#: System views a query may read besides the lake's tables.
SYSTEM_VIEWS = frozenset({("information_schema", "tables"), ("information_schema", "columns")})

DATA_STATEMENTS = frozenset({"INSERT", "UPDATE", "DELETE", "MERGE_INTO", "TRANSACTION"})
SCHEMA_STATEMENTS = frozenset({"CREATE", "DROP", "ALTER"})
_PLAIN_NAME = re.compile(r"[a-z_][a-z0-9_]*")


class SqlRefusedError(WarehouseError):
    """User SQL that is not allowed to run; the message says what and why."""


class SqlTimeoutError(WarehouseError):
    """User SQL ran past its time limit and was interrupted."""


class SqlInterruptedError(WarehouseError):
    """User SQL was interrupted (Ctrl-C); DuckDB stopped it."""


@dataclass(frozen=True)
class Statement:
    """One checked statement: its DuckDB type name, its text, and what to bind before it runs
    (:func:`check_plan`: the statement itself, an EXPLAIN's statement, or nothing for DDL and
    transactions) with whether it may read the schema listings."""

    kind: str
    text: str
    bind: str | None = None
    listings: bool = False


# -- the check ----------------------------------------------------------------------------------


def check_user_sql(
    con: duckdb.DuckDBPyConnection, query: str, *, write: bool = False, schema: bool = False
) -> list[Statement]:
    """The statements of ``query`` if they may run in this mode, else :class:`SqlRefusedError`
    (``duckdb.ParserException`` for SQL that does not parse). ``con``: the sandboxed
    connection, whose lake tables are the readable ones."""
    parsed = _parse(query)
    if not parsed:
        raise SqlRefusedError("the query is empty")
    policy = _Policy.of(con)
    out = []
    for stmt in parsed:
        kind, text = stmt.type.name, stmt.query
        if kind == "SELECT":
            policy.check_select(text)
            out.append(Statement(kind, text, bind=text, listings=True))
        elif kind == "EXPLAIN":
            inner = _explained(text)
            policy.check_select(inner)
            out.append(Statement(kind, text, bind=inner, listings=True))
        elif kind in DATA_STATEMENTS and write:
            policy.check_tokens(text)
            out.append(Statement(kind, text, bind=None if kind == "TRANSACTION" else text))
        elif kind in SCHEMA_STATEMENTS and schema:
            policy.check_tokens(text)  # DDL has no plan to bind: its names are checked
            out.append(Statement(kind, text))
        else:
            raise SqlRefusedError(_refusal(_kind_name(kind, text), write=write, schema=schema))
    return out


def _kind_name(kind: str, text: str) -> str:
    """The statement's name for a message: DuckDB files INSTALL under LOAD."""
    first = _tokens(text)[0][0].upper() if text.strip() else kind
    return first if kind == "LOAD" and first in ("INSTALL", "LOAD", "FORCE") else kind


def _refusal(kind: str, *, write: bool, schema: bool) -> str:
    what = f"refusing to run {_article(kind)} {kind} statement"
    if kind in SCHEMA_STATEMENTS and write:
        return (
            f"{what}: schema changes need --schema as well as --write (and `webloop warehouse "
            "rollback SNAPSHOT` undoes a mistake)"
        )
    if kind in DATA_STATEMENTS | SCHEMA_STATEMENTS:
        return f"{what}: this SQL is read-only (pass --write)"
    allowed = ["SELECT", "EXPLAIN"] + (["INSERT/UPDATE/DELETE/MERGE"] if write else [])
    allowed += ["CREATE/DROP/ALTER"] if schema else []
    return (
        f"{what}: only {', '.join(allowed[:-1])} and {allowed[-1]} run here (no files, "
        "attachments, extensions, settings, PRAGMA or EXPLAIN ANALYZE)"
    )


def _article(word: str) -> str:
    return "an" if word[:1].upper() in "AEIOU" else "a"


def _parse(query: str) -> list[duckdb.Statement]:
    """Parse without touching files (``IMPORT DATABASE`` reads files while parsing)."""
    con = duckdb.connect(config={"enable_external_access": False})
    try:
        return con.extract_statements(query)
    finally:
        con.close()


def _tokens(text: str) -> list[tuple[str, duckdb.token_type]]:
    """DuckDB's tokens of ``text`` as (token text, type). DuckDB counts positions in UTF-8
    bytes, not characters: slice the encoded text."""
    raw = text.encode()
    marks = duckdb.tokenize(text)
    ends = [pos for pos, _ in marks[1:]] + [len(raw)]
    return [
        (raw[pos:end].decode(errors="replace").strip(), kind)
        for (pos, kind), end in zip(marks, ends, strict=True)
    ]


def _explained(text: str) -> str:
    """The statement an ``EXPLAIN`` explains; ``EXPLAIN ANALYZE`` (which runs it) is refused."""
    raw = text.encode()
    marks = duckdb.tokenize(text)
    words = [t.upper() for t, _ in _tokens(text)]
    if len(marks) < 2 or words[0] != "EXPLAIN":
        raise SqlRefusedError("cannot read this EXPLAIN statement")
    if words[1] in ("ANALYZE", "ANALYSE"):
        raise SqlRefusedError(
            "refusing to run EXPLAIN ANALYZE: it executes the statement; use plain EXPLAIN"
        )
    if words[1] == "(":  # EXPLAIN (FORMAT json, ANALYZE) …: options are not needed here
        raise SqlRefusedError("refusing EXPLAIN with options: use plain EXPLAIN SELECT …")
    inner = raw[marks[1][0] :].decode()
    if [s.type.name for s in _parse(inner)] != ["SELECT"]:
        raise SqlRefusedError("refusing to EXPLAIN anything but one SELECT statement")
    return inner


@dataclass(frozen=True)
class _Policy:
    """What may be named, for one sandboxed connection."""

    tables: frozenset[str]
    views: dict[str, str]  # the lake's views: name → stored CREATE VIEW text
    catalogs: frozenset[str]  # every attached catalog but the lake
    scalars: frozenset[str]
    system_names: frozenset[str]

    @classmethod
    def of(cls, con: duckdb.DuckDBPyConnection) -> _Policy:
        tables = {
            r[0].lower()
            for r in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = ?", [LAKE]
            ).fetchall()
        }
        views = {
            r[0].lower(): r[1]
            for r in con.execute(
                "SELECT view_name, sql FROM duckdb_views() WHERE database_name = ?", [LAKE]
            ).fetchall()
        }
        catalogs = frozenset(
            r[0].lower()
            for r in con.execute("SELECT database_name FROM duckdb_databases()").fetchall()
        ) - {LAKE}
        return cls(
            frozenset(tables | set(views)),
            views,
            catalogs,
            _vetted_functions(),
            _system_names(),
        )

    # -- SELECT: the parse tree

    def check_select(self, text: str) -> None:
        tree = json.loads(_serialize(text))
        if tree.get("error"):
            raise SqlRefusedError(f"cannot check this statement: {tree.get('error_message')}")
        ctes = {name.lower() for name in _cte_names(tree)}
        for name in ctes:
            if not _PLAIN_NAME.fullmatch(name) or name in self.system_names:
                raise SqlRefusedError(
                    f"refusing a CTE named {name!r}: name CTEs with plain identifiers that "
                    "are not DuckDB system names"
                )
        for node in _nodes(tree):
            kind = node.get("type")
            if kind == "BASE_TABLE":
                self._table(node, ctes)
            elif kind == "TABLE_FUNCTION":
                self._table_function(node["function"])
            elif kind == "SHOW_REF" and node.get("query") is None:
                if node.get("table_name") != '"tables"':
                    raise SqlRefusedError("only SHOW TABLES, DESCRIBE and SUMMARIZE run here")
            elif node.get("class") in ("FUNCTION", "WINDOW") and not node.get("_table"):
                self._scalar(node)

    def _table(self, node: dict, ctes: set[str]) -> None:
        catalog, schema = node["catalog_name"].lower(), node["schema_name"].lower()
        name = node["table_name"].lower()
        where = (catalog, schema)
        if where == ("", "") and name in ctes:
            return
        if (schema, name) in SYSTEM_VIEWS and catalog in ("", LAKE):
            return
        if where in (("", ""), ("", "main"), ("", LAKE), (LAKE, ""), (LAKE, "main")):
            if name in self.views:
                self._view(name)
                return
            if name in self.tables:
                return
            known = ", ".join(sorted(self.tables))
            raise SqlRefusedError(
                f"no warehouse table named {node['table_name']!r} (SQL here reads only the "
                f"warehouse's tables: {known})"
            )
        full = ".".join(p for p in (catalog, schema, name) if p)
        raise SqlRefusedError(
            f"refusing to read {full}: SQL here reads only the warehouse's own tables"
        )

    def _view(self, name: str) -> None:
        """A lake view is read only when its stored query passes the read-only rules."""
        if name in _checking_views.names:
            return  # a view that names itself: DuckDB refuses it when it binds
        _checking_views.names.add(name)
        try:
            self.check_select(_view_query(self.views[name]))
        except SqlRefusedError as exc:
            raise SqlRefusedError(
                f"refusing to read the view {name}: its stored SQL: {exc}"
            ) from None
        finally:
            _checking_views.names.discard(name)

    def _table_function(self, fn: dict) -> None:
        fn["_table"] = True  # walked again as a node: not a scalar call
        name, schema = fn["function_name"].lower(), fn.get("schema", "").lower()
        catalog = fn.get("catalog", "").lower()
        if not catalog and not schema and name in TABLE_FUNCTIONS | LAKE_FUNCTIONS:
            return
        if LAKE in (schema, catalog) and name in LAKE_METHODS:
            return
        full = ".".join(p for p in (catalog, schema, name) if p)
        raise SqlRefusedError(
            f"refusing to call {full}(): it reads outside the warehouse tables, runs SQL "
            f"given as text, or changes the lake's files (table functions here: "
            f"{', '.join(sorted(TABLE_FUNCTIONS | LAKE_FUNCTIONS))})"
        )

    def _scalar(self, node: dict) -> None:
        name = node["function_name"].lower()
        where = (node.get("catalog", "").lower(), node.get("schema", "").lower())
        if node.get("is_operator") or (where in (("", ""), ("", "main")) and name in self.scalars):
            return
        raise SqlRefusedError(f"refusing to call {name}(): not a function SQL here may call")

    # -- write statements: the tokens

    def check_tokens(self, text: str) -> None:
        tokens = _tokens(text)
        callable_names = self.scalars | TABLE_FUNCTIONS | LAKE_FUNCTIONS
        for (tok, kind), (nxt, _) in itertools.pairwise([*tokens, ("", None)]):
            if kind == duckdb.token_type.keyword and nxt == "." and tok.lower() in self.catalogs:
                kind = duckdb.token_type.identifier  # `temp.main.t`: a keyword naming a catalog
            if kind != duckdb.token_type.identifier:
                continue
            name = _identifier(tok)
            if name in self.catalogs:
                raise SqlRefusedError(
                    f"refusing to touch the catalog {name}: SQL here changes only the "
                    "warehouse's own tables"
                )
            if name in self.system_names:
                raise SqlRefusedError(
                    f"refusing to read {name}: SQL here reads only the warehouse's own tables"
                )
            if nxt == "(" and name not in callable_names | self.tables:
                raise SqlRefusedError(
                    f"refusing to call {name}(): not a function SQL here may call"
                )


def check_plan(cur: duckdb.DuckDBPyConnection, text: str, *, listings: bool = False) -> None:
    """Bind ``text`` on ``cur`` (``EXPLAIN`` plans it and runs nothing) and refuse it when an
    operator of its plan reads or writes anything but the lake: the lake's catalog database,
    another catalog, a system table, a file. ``listings``: it may read the schema listings
    (``information_schema.tables`` / ``.columns``, ``SHOW TABLES``). Run on the cursor the
    statement then runs on, after the statements before it (a table they create binds)."""
    try:
        rows = cur.execute("EXPLAIN (FORMAT json) " + text).fetchall()
    except duckdb.PermissionException as exc:
        refused = str(exc).splitlines()[0]
    else:
        refused = None
    if refused is not None:
        raise SqlRefusedError(f"refused: this reaches outside the warehouse: {refused}")
    allowed = ROWLESS_SOURCES | _TABLE_FUNCTION_OPERATORS | (SCHEMA_LISTINGS if listings else set())
    system_names = _system_names()
    for _, plan in rows:
        for node in _nodes(json.loads(plan)):
            if "name" in node and "children" in node:
                _operator(node["name"].strip().upper(), allowed, system_names)


def _operator(name: str, allowed: frozenset[str], system_names: frozenset[str]) -> None:
    if name.startswith("DUCKLAKE_") or name in allowed or name == "COPY_TO_FILE":
        return  # COPY_TO_FILE: how the lake's inserts write Parquet (COPY statements are refused)
    if _WRITES.search(name):
        raise SqlRefusedError(
            f"refusing to write through {name}: SQL here changes only the warehouse's own "
            "tables (not the lake's catalog database, system, temp or attached ones)"
        )
    if name.endswith("_SCAN") or name.lower() in system_names:
        raise SqlRefusedError(
            f"refusing to read through {name}: SQL here reads only the warehouse's own tables "
            "(not the lake's catalog database, system views or files)"
        )


def _identifier(token: str) -> str:
    if token.startswith('"') and token.endswith('"') and len(token) >= 2:
        return token[1:-1].replace('""', '"').lower()
    return token.lower()


def _serialize(text: str) -> str:
    con = duckdb.connect(config={"enable_external_access": False})
    try:
        return con.execute("SELECT json_serialize_sql(?)", [text]).fetchone()[0]
    finally:
        con.close()


def _nodes(tree: Any) -> Iterator[dict]:
    """Every object of a parse tree, parents before children."""
    stack = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))


def _cte_names(tree: Any) -> Iterator[str]:
    for node in _nodes(tree):
        cte_map = node.get("cte_map")
        if isinstance(cte_map, dict):
            for entry in cte_map.get("map", []):
                yield entry["key"]


@functools.cache
def _vetted_functions() -> frozenset[str]:
    """The functions people's SQL may call (:mod:`warehouse.sqlfunctions`): DuckDB's scalar,
    aggregate and macro functions filed under a vetted category, the vetted uncategorised ones,
    the window functions."""
    con = duckdb.connect(config={"enable_external_access": False})
    try:
        rows = con.execute(
            "SELECT DISTINCT function_name FROM duckdb_functions() "
            "WHERE function_type IN ('scalar', 'aggregate', 'macro') "
            "AND len(list_intersect(categories, ?)) > 0",
            [sorted(VETTED_CATEGORIES)],
        ).fetchall()
    finally:
        con.close()
    return frozenset({r[0].lower() for r in rows} | VETTED_UNCATEGORIZED | WINDOW_FUNCTIONS)


class _Checking(threading.local):
    """The views being checked on this thread (a view that names itself ends the walk)."""

    def __init__(self) -> None:
        self.names: set[str] = set()


_checking_views = _Checking()


def _view_query(create: str) -> str:
    """The query of a stored ``CREATE VIEW name [(columns)] AS query`` statement."""
    raw = create.encode()
    depth = 0
    for (pos, _), (tok, kind) in zip(duckdb.tokenize(create), _tokens(create), strict=True):
        depth += (tok == "(") - (tok == ")")
        if depth == 0 and kind == duckdb.token_type.keyword and tok.upper() == "AS":
            return raw[pos + 2 :].decode().strip().rstrip(";")
    raise SqlRefusedError("cannot read a stored view's query")


@functools.cache
def _system_names() -> frozenset[str]:
    """Names of DuckDB's system views and table functions (``duckdb_databases``…) that a write
    statement may not name, less the allowed ones."""
    con = duckdb.connect(config={"enable_external_access": False})
    try:
        views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views()").fetchall()}
        tables = {
            r[0]
            for r in con.execute(
                "SELECT DISTINCT function_name FROM duckdb_functions() "
                "WHERE function_type IN ('table', 'table_macro', 'pragma')"
            ).fetchall()
        }
    finally:
        con.close()
    return frozenset(n.lower() for n in views | tables) - TABLE_FUNCTIONS - {"columns", "tables"}


# -- running ------------------------------------------------------------------------------------


def run_user_sql(
    con: duckdb.DuckDBPyConnection,
    query: str,
    *,
    write: bool = False,
    schema: bool = False,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    fetch: Callable[[duckdb.DuckDBPyConnection], T] = lambda cur: cur.pl(),
) -> tuple[T | None, int]:
    """Check ``query`` (:func:`check_user_sql`) and run it on a fresh cursor of ``con``.

    Returns ``fetch(cursor)`` for the last statement when it has a result (else ``None``) and
    the number of statements. ``timeout_s`` bounds the whole run, fetching included; past it
    DuckDB is interrupted and :class:`SqlTimeoutError` raised; Ctrl-C interrupts DuckDB and
    raises :class:`SqlInterruptedError`. DuckDB's own permission errors (a file outside the
    warehouse) are raised as :class:`SqlRefusedError`.
    """
    with _ctrl_c_stops():  # checking the query runs DuckDB statements too
        statements = check_user_sql(con, query, write=write, schema=schema)
        cur = con.cursor()
    try:
        with _ctrl_c_stops():
            cur.execute(f"USE {LAKE}")

        def work() -> T | None:
            for stmt in statements:
                if stmt.bind is not None:
                    check_plan(cur, stmt.bind, listings=stmt.listings)
                _execute(cur, stmt.text)
            return fetch(cur) if cur.description else None

        return _interruptible(cur, work, timeout_s), len(statements)
    finally:
        cur.close()


def _execute(cur: duckdb.DuckDBPyConnection, text: str) -> None:
    refused = None
    try:
        cur.execute(text)
    except duckdb.PermissionException as exc:
        refused = str(exc).splitlines()[0]
    if refused is not None:  # raised outside the except: a refusal, not an I/O failure
        raise SqlRefusedError(
            "refused: this reaches outside the warehouse (SQL here reads only the "
            f"warehouse's own tables): {refused}"
        )


def _interruptible(
    cur: duckdb.DuckDBPyConnection, work: Callable[[], T], timeout_s: float | None
) -> T:
    """Run ``work`` here; a timer ``cur.interrupt()``s it past ``timeout_s``. Ctrl-C needs no
    thread: DuckDB interrupts a query of the main thread itself on SIGINT (a worker thread
    would not do: a SIGINT while DuckDB runs outside the main thread aborts the process)."""
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        cur.interrupt()

    timer = None if timeout_s is None else threading.Timer(timeout_s, expire)
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        return work()
    except (duckdb.InterruptException, RuntimeError, KeyboardInterrupt) as exc:
        # Stop the query's other threads too: closing the cursor otherwise drains their tasks
        # (DuckDB's CancelTasks ran an interrupted hours-long scan to its end, in 4 of 8 tries).
        cur.interrupt()
        if timed_out.is_set():
            raise SqlTimeoutError(
                f"the query ran past its time limit of {timeout_s:g} s and was stopped"
            ) from None
        if _interrupted(exc):
            raise SqlInterruptedError("interrupted: the query was stopped") from None
        raise
    finally:
        if timer is not None:
            timer.cancel()


def _interrupted(exc: BaseException) -> bool:
    """A Ctrl-C: Python's, or DuckDB's interruption of the statement it was running."""
    return isinstance(exc, KeyboardInterrupt | duckdb.InterruptException) or (
        isinstance(exc, RuntimeError) and "interrupted" in str(exc).lower()
    )


@contextlib.contextmanager
def _ctrl_c_stops() -> Iterator[None]:
    """A Ctrl-C before the query's own statements run is the same interruption as one during."""
    try:
        yield
    except (duckdb.InterruptException, RuntimeError, KeyboardInterrupt) as exc:
        if _interrupted(exc):
            raise SqlInterruptedError("interrupted: the query was stopped") from None
        raise
