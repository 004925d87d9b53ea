"""Undo changes to the warehouse: restore every table (and view) as it was at a snapshot.

::

    from warehouse.rollback import rollback
    report = rollback(wh, 41)      # the lake's tables as of snapshot 41, as a new snapshot
    report.snapshot                # the new snapshot: roll back to report.previous to undo it

Every write to the DuckLake is a snapshot, so a mistaken ``webloop sql --write`` (a DELETE, a
DROP, even ``DROP SCHEMA main CASCADE``) is undone by rolling back to the snapshot before it.
A rollback rewrites nothing in the past: it is one new transaction that recreates the tables
and views dropped since, drops those created since, and replaces the rows of every table that
a later snapshot changed with its rows at the target (time travel through a read-only
``SNAPSHOT_VERSION`` attachment). History stays; the rollback is itself undoable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from warehouse.connection import LAKE, WarehouseError, attach_target, sql_string
from warehouse.store import Warehouse

_AT = "webloop_rollback_at"


@dataclass(frozen=True)
class TableRestore:
    """What a rollback did to one table: ``action`` is ``rows`` (its rows replaced),
    ``recreated`` (dropped since the target, created again), ``dropped`` (created since) or
    ``view``; ``rows_before`` / ``rows_after`` count its rows (``None``: no such table)."""

    table: str
    action: str
    rows_before: int | None
    rows_after: int | None


@dataclass(frozen=True)
class RollbackReport:
    """A finished rollback: the snapshot it restored, the one before it (roll back there to
    undo the rollback), the new snapshot it wrote, and what changed per table."""

    target: int
    previous: int
    snapshot: int
    tables: list[TableRestore] = field(default_factory=list)


def rollback(wh: Warehouse, snapshot: int, *, author: str = "webloop") -> RollbackReport:
    """Restore the lake's tables and views as of ``snapshot`` in one new transaction.

    Raises :class:`WarehouseError` for a snapshot that does not exist or was expired, or when
    nothing changed since it."""
    con = wh.con
    current = _latest(con)
    _check_target(con, snapshot, current)
    con.execute(
        f"ATTACH {sql_string(attach_target(wh.cfg))} AS {_AT} "
        f"(READ_ONLY, SNAPSHOT_VERSION {int(snapshot)})"
    )
    try:
        plan = _plan(con, snapshot)
        if not plan:
            raise WarehouseError(f"nothing changed since snapshot {snapshot}: nothing to undo")
        tables = _apply(con, plan, snapshot, author)
    finally:
        con.execute(f"DETACH {_AT}")
    return RollbackReport(snapshot, current, _latest(con), tables)


def _latest(con: duckdb.DuckDBPyConnection) -> int:
    row = con.execute("SELECT max(snapshot_id) FROM ducklake_snapshots(?)", [LAKE]).fetchone()
    return int(row[0])


def _check_target(con: duckdb.DuckDBPyConnection, snapshot: int, current: int) -> None:
    ids = {
        int(r[0])
        for r in con.execute("SELECT snapshot_id FROM ducklake_snapshots(?)", [LAKE]).fetchall()
    }
    if snapshot not in ids:
        known = f"{min(ids)}..{current}" if ids else "none"
        raise WarehouseError(
            f"no snapshot {snapshot} in this warehouse (snapshots {known}; expired snapshots "
            'cannot be restored): see `webloop sql "FROM lake.snapshots()"`'
        )
    if snapshot == current:
        raise WarehouseError(f"snapshot {snapshot} is the latest: nothing to undo")


def _objects(con: duckdb.DuckDBPyConnection, db: str) -> dict[str, tuple[str, str]]:
    """``name -> (kind, CREATE sql)`` of the main schema's tables and views in ``db``."""
    rows = con.execute(
        "SELECT table_name, 'table', sql FROM duckdb_tables() "
        "WHERE database_name = ? AND schema_name = 'main' "
        "UNION ALL SELECT view_name, 'view', sql FROM duckdb_views() "
        "WHERE database_name = ? AND schema_name = 'main' AND NOT internal",
        [db, db],
    ).fetchall()
    return {name: (kind, sql) for name, kind, sql in rows}


def _touched(con: duckdb.DuckDBPyConnection, snapshot: int) -> set[str]:
    """Names of the tables any snapshot after ``snapshot`` created, changed or dropped."""
    ids: set[int] = set()
    names: set[str] = set()
    for (changes,) in con.execute(
        "SELECT changes FROM ducklake_snapshots(?) WHERE snapshot_id > ?", [LAKE, snapshot]
    ).fetchall():
        for key, values in (changes or {}).items():
            for v in values:
                if key.endswith("_created"):
                    names.add(v.split(".", 1)[-1].strip('"'))
                elif key.startswith(("tables_", "views_")) and str(v).isdigit():
                    ids.add(int(v))
    if ids:
        meta = f"__ducklake_metadata_{LAKE}"
        found = con.execute(
            f"SELECT DISTINCT table_name FROM {meta}.ducklake_table "
            "WHERE list_contains(?, table_id) "
            f"UNION SELECT DISTINCT view_name FROM {meta}.ducklake_view "
            "WHERE list_contains(?, view_id)",
            [sorted(ids), sorted(ids)],
        ).fetchall()
        names |= {r[0] for r in found}
    return names


def _plan(con: duckdb.DuckDBPyConnection, snapshot: int) -> list[tuple[str, str]]:
    """``(name, action)`` per object to restore: ``rows``, ``recreated``, ``dropped``, ``view``."""
    then, now = _objects(con, _AT), _objects(con, LAKE)
    touched = _touched(con, snapshot)
    plan = []
    for name in sorted(set(then) | set(now)):
        was, cur = then.get(name), now.get(name)
        if was is None:
            plan.append((name, "dropped"))
        elif was[0] == "view":
            if cur != was:
                plan.append((name, "view"))
        elif cur != was:
            plan.append((name, "recreated"))
        elif name in touched:
            plan.append((name, "rows"))
    return plan


def _count(con: duckdb.DuckDBPyConnection, db: str, name: str) -> int:
    return int(con.execute(f'SELECT count(*) FROM {db}.main."{name}"').fetchone()[0])


def _apply(
    con: duckdb.DuckDBPyConnection, plan: list[tuple[str, str]], snapshot: int, author: str
) -> list[TableRestore]:
    then, now = _objects(con, _AT), _objects(con, LAKE)
    out = []
    con.execute("BEGIN")
    try:
        con.execute(f"CREATE SCHEMA IF NOT EXISTS {LAKE}.main")
        con.execute(f"USE {LAKE}.main")
        for name, action in plan:
            before = _count(con, LAKE, name) if now.get(name, ("",))[0] == "table" else None
            if action == "rows":  # same table, same identity: its rows replaced
                con.execute(f'DELETE FROM {LAKE}.main."{name}"')
            elif name in now:
                con.execute(f'DROP {now[name][0].upper()} IF EXISTS {LAKE}.main."{name}"')
            if action in ("recreated", "view"):
                con.execute(then[name][1])
            if action in ("rows", "recreated"):
                con.execute(f'INSERT INTO {LAKE}.main."{name}" SELECT * FROM {_AT}.main."{name}"')
            after = _count(con, LAKE, name) if action in ("rows", "recreated") else None
            out.append(TableRestore(name, action, before, after))
        con.execute(
            "CALL ducklake_set_commit_message(?, ?, ?)",
            [LAKE, author, f"rollback to snapshot {snapshot}"],
        )
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return out
