"""What is in a warehouse, and how to open it from other DuckDB clients."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from warehouse import migrations
from warehouse.config import WarehouseConfig
from warehouse.connection import LAKE, extension_directory, sql_string
from warehouse.records import RECORD_TYPES
from warehouse.secrets import redact
from warehouse.store import Warehouse
from warehouse.versions import current_snapshot, pinned_snapshots


def checks(wh: Warehouse) -> dict[str, str]:
    """Whether the catalog, the data path and the blob store answer: ``"ok"``, or what failed
    (credentials never appear: :mod:`warehouse.secrets` masks them)."""
    out = {"catalog": "ok"}  # it answered: the warehouse is open
    try:
        if wh.cfg.is_local_data:
            if not Path(wh.cfg.data_path).is_dir():
                raise OSError(f"no folder {wh.cfg.data_path}")
        else:
            wh.con.execute("SELECT count(*) FROM glob(?)", [wh.cfg.data_path + "*"]).fetchone()
        out["data"] = "ok"
    except Exception as exc:  # any failure is reported, not raised: this is the diagnosis
        out["data"] = redact(f"{type(exc).__name__}: {exc}")
    try:
        wh.blobs.ping()
        out["blobs"] = "ok"
    except Exception as exc:
        out["blobs"] = redact(f"{type(exc).__name__}: {exc}")
    return out


def collect(wh: Warehouse) -> dict[str, Any]:
    """Where catalog, data and blobs live and whether they answer (:func:`checks`); counts per
    table, snapshots, pins, data and blob sizes (when the blob store answers)."""
    tables = [{"table": r.TABLE, "rows": wh.count(r)} for r in RECORD_TYPES]
    answers = checks(wh)
    files = _files(wh)
    blob_count, blob_bytes = wh.blobs.stats() if answers["blobs"] == "ok" else (None, None)
    return {
        "catalog": wh.cfg.describe(),
        "data_path": wh.cfg.data_path,
        "blob_path": wh.cfg.blob_path,
        "checks": answers,
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
