"""What is in a warehouse, and how to open it from other DuckDB clients."""

from __future__ import annotations

from typing import Any

from warehouse import migrations
from warehouse.config import WarehouseConfig
from warehouse.connection import LAKE, extension_directory, sql_string
from warehouse.records import RECORD_TYPES
from warehouse.store import Warehouse
from warehouse.versions import current_snapshot, pinned_snapshots


def collect(wh: Warehouse) -> dict[str, Any]:
    """Counts per table, snapshots, pins, data and blob sizes."""
    tables = [{"table": r.TABLE, "rows": wh.count(r)} for r in RECORD_TYPES]
    files = _files(wh)
    blob_count, blob_bytes = wh.blobs.stats()
    return {
        "catalog": wh.cfg.describe(),
        "data_path": wh.cfg.data_path,
        "blob_path": str(wh.cfg.blob_path),
        "schema_version": migrations.current_version(wh.con),
        "snapshots": int(wh.sql(f"SELECT count(*) FROM {LAKE}.snapshots()").item()),
        "latest_snapshot": current_snapshot(wh),
        "pinned": sorted(pinned_snapshots(wh)),
        "data_files": files[0],
        "data_bytes": files[1],
        "blob_count": blob_count,
        "blob_bytes": blob_bytes,
        "tables": tables,
    }


def _files(wh: Warehouse) -> tuple[int, int]:
    n = size = 0
    for r in RECORD_TYPES:
        row = wh.con.execute(
            "SELECT count(*), coalesce(sum(data_file_size_bytes), 0) "
            "FROM ducklake_list_files(?, ?)",
            [LAKE, r.TABLE],
        ).fetchone()
        n += int(row[0])
        size += int(row[1])
    return n, size


def attach_sql(cfg: WarehouseConfig) -> str:
    """SQL statements that open this warehouse from the DuckDB CLI or any DuckDB client."""
    if cfg.catalog_kind == "sqlite":
        target = "ducklake:sqlite:" + cfg.catalog
        ext = "sqlite"
        note = ""
    else:
        target = "ducklake:postgres:" + cfg.describe().removeprefix("postgres:")
        ext = "postgres"
        note = "-- the password is not printed: set PGPASSWORD in the environment instead\n"
    return (
        "-- Open this webloop warehouse from any DuckDB (1.4+) client.\n"
        f"-- With network:  INSTALL ducklake; INSTALL {ext};\n"
        "-- Offline, with webloop's environment, instead:\n"
        f"--   SET extension_directory = {sql_string(extension_directory())};\n"
        f"{note}"
        f"ATTACH {sql_string(target)} AS {LAKE} (DATA_PATH {sql_string(cfg.data_path)}, "
        "READ_ONLY);\n"
        f"USE {LAKE};\n"
        "-- Drop READ_ONLY to write (webloop retries on contention; other clients may not).\n"
    )
