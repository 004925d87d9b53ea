"""The warehouse for SQL written by people: ``webloop sql`` and a dashboard's SQL page.

::

    with open_sandboxed() as wh:                     # read-only: creates and migrates nothing
        frame, n = run_user_sql(wh.con, "SELECT count(*) FROM steps")  # a polars frame

The connection is sandboxed (:func:`warehouse.connection.sandbox`): it reads the lake's tables
and cannot open other files, reach the network, attach databases or load extensions.
:func:`run_user_sql` runs only what :mod:`warehouse.usersql`'s allow-list admits (SELECT on the
lake's tables with core functions; data changes with ``write``; schema changes with ``schema``),
each query on a fresh cursor with a time limit.
"""

from __future__ import annotations

from warehouse.config import WarehouseConfig
from warehouse.connection import NoWarehouseError
from warehouse.store import Warehouse
from warehouse.usersql import (
    SqlInterruptedError,
    SqlRefusedError,
    SqlTimeoutError,
    check_user_sql,
    run_user_sql,
)

__all__ = [
    "NoWarehouseError",
    "SqlInterruptedError",
    "SqlRefusedError",
    "SqlTimeoutError",
    "check_user_sql",
    "open_sandboxed",
    "run_user_sql",
]


def open_sandboxed(cfg: WarehouseConfig | None = None, *, write: bool = False) -> Warehouse:
    """A sandboxed warehouse. Read-only (the default) creates, migrates and writes nothing and
    raises :class:`NoWarehouseError` when there is no warehouse yet; ``write=True`` opens (and
    creates or upgrades) it for data changes, still inside the sandbox."""
    cfg = cfg or WarehouseConfig.from_env()
    return Warehouse.open(cfg, migrate=write, read_only=not write, sandboxed=True)
