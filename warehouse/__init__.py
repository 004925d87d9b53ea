"""The webloop trajectory warehouse: DuckDB SQL over a DuckLake plus a content-addressed blob store.

Every stage reads and writes through here. Public surface::

    from warehouse import Warehouse, WarehouseConfig
    from warehouse.records import Task, Run, Trajectory, Step, Judgment, ...

This package imports no other webloop package (a test enforces the import direction).
"""

from warehouse.config import WarehouseConfig
from warehouse.connection import WarehouseError
from warehouse.migrations import SchemaTooNewError
from warehouse.store import Warehouse, WriteResult

__all__ = ["SchemaTooNewError", "Warehouse", "WarehouseConfig", "WarehouseError", "WriteResult"]
