"""SQL written by people (``webloop sql``, the dashboard's SQL page): what may run, and how it runs.

An **allow-list**, not a deny-list. Read-only SQL runs only what is known to read the warehouse:

* statements: ``SELECT`` (with ``WITH``, ``VALUES``, ``DESCRIBE``, ``SUMMARIZE``, ``SHOW TABLES``)
  and plain ``EXPLAIN`` of one (never ``EXPLAIN ANALYZE``, which executes its statement);
* checked on DuckDB's own parse tree (``json_serialize_sql``), so comments, quoting, case and
  non-ASCII text cannot hide anything from the check;
* every function called is a core scalar, aggregate or window function (less the few that read
  settings or write logs), every table function one of :data:`TABLE_FUNCTIONS` (ranges, JSON
  unnesting, the lake's read-only snapshot functions), and every table a table of the lake (or
  a CTE of the query, or ``information_schema.tables`` / ``.columns``).

``write=True`` (``webloop sql --write``) adds the data statements (INSERT, UPDATE, DELETE,
MERGE, transactions); ``schema=True`` adds CREATE, DROP and ALTER. DuckDB serialises only
SELECT statements, so write statements are checked on DuckDB's token stream instead: every name
called must be an allowed function and no name may be a system view (``duckdb_databases``…).

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
#: Core scalar functions left out of the allow-list: they read settings, write logs, or
#: advance sequences.
DENIED_SCALARS = frozenset({"current_setting", "write_log", "nextval", "currval", "setseed"})
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
    """One checked statement: its DuckDB type name and its text."""

    kind: str
    text: str


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
        elif kind == "EXPLAIN":
            policy.check_select(_explained(text))
        elif (kind in DATA_STATEMENTS and write) or (kind in SCHEMA_STATEMENTS and schema):
            policy.check_tokens(text)
        else:
            raise SqlRefusedError(_refusal(_kind_name(kind, text), write=write, schema=schema))
        out.append(Statement(kind, text))
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
    scalars: frozenset[str]
    system_names: frozenset[str]

    @classmethod
    def of(cls, con: duckdb.DuckDBPyConnection) -> _Policy:
        tables = frozenset(
            r[0].lower()
            for r in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = ? "
                "UNION SELECT view_name FROM duckdb_views() WHERE database_name = ?",
                [LAKE, LAKE],
            ).fetchall()
        )
        return cls(tables, _core_scalars(), _system_names())

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
            if kind != duckdb.token_type.identifier:
                continue
            name = _identifier(tok)
            if name in self.system_names:
                raise SqlRefusedError(
                    f"refusing to read {name}: SQL here reads only the warehouse's own tables"
                )
            if nxt == "(" and name not in callable_names | self.tables:
                raise SqlRefusedError(
                    f"refusing to call {name}(): not a function SQL here may call"
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
def _core_scalars() -> frozenset[str]:
    """Core scalar, aggregate and macro functions of a DuckDB without extensions, the window
    functions (not listed there) and ``unnest`` in a select list, less :data:`DENIED_SCALARS`."""
    con = duckdb.connect(config={"enable_external_access": False})
    try:
        rows = con.execute(
            "SELECT DISTINCT function_name FROM duckdb_functions() "
            "WHERE function_type IN ('scalar', 'aggregate', 'macro')"
        ).fetchall()
    finally:
        con.close()
    windows = {"unnest", "row_number", "rank", "dense_rank", "percent_rank", "cume_dist", "ntile"}
    windows |= {"lag", "lead", "first_value", "last_value", "nth_value", "fill"}
    return frozenset({r[0].lower() for r in rows} | windows) - DENIED_SCALARS


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
