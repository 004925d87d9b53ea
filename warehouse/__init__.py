"""The webloop trajectory warehouse: DuckDB SQL over a DuckLake plus a content-addressed blob store.

Every stage reads and writes through here. Public surface::

    from warehouse import Warehouse, WarehouseConfig
    from warehouse.records import Task, Run, Trajectory, Step, Judgment, ...

This package imports no other webloop package (a test enforces the import direction).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warehouse.config import WarehouseConfig
    from warehouse.connection import WarehouseError
    from warehouse.migrations import SchemaTooNewError
    from warehouse.store import Warehouse, WriteResult

__all__ = ["SchemaTooNewError", "Warehouse", "WarehouseConfig", "WarehouseError", "WriteResult"]

# Loaded on first use (PEP 562): a module that needs only a light part (``warehouse.retry``,
# ``warehouse.ids``) does not pay for DuckDB and polars, e.g. the model code on a GPU machine.
_WHERE = {
    "WarehouseConfig": "warehouse.config",
    "WarehouseError": "warehouse.connection",
    "SchemaTooNewError": "warehouse.migrations",
    "Warehouse": "warehouse.store",
    "WriteResult": "warehouse.store",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'warehouse' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
