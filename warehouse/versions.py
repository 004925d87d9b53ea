"""Snapshots, pins and maintenance.

Every committed transaction is a DuckLake snapshot. A dataset (or anything that must stay
reproducible) pins the current snapshot; :func:`maintain` compacts the lake and expires old
snapshots but never one that is pinned, so ``Warehouse.read(cls, version=pinned)`` keeps working.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from warehouse.connection import LAKE
from warehouse.ids import make_id
from warehouse.records import Pin, utcnow
from warehouse.store import Warehouse


def current_snapshot(wh: Warehouse) -> int:
    """The id of the latest committed snapshot (read through ``ducklake_snapshots``, which
    answers even when the lake's ``main`` schema is gone: ``lake.snapshots()`` resolves in it,
    and a mistaken ``DROP SCHEMA main`` must still be undoable)."""
    return int(wh.sql(f"SELECT max(snapshot_id) AS s FROM ducklake_snapshots('{LAKE}')").item())


BOOKKEEPING_TABLES = (
    "datasets",
    "dataset_members",
    "pins",
    "runs",
    "training_runs",
    "metrics",
    "checkpoints",
    "evaluations",
)
"""Tables whose writes record what was done with the data, not data: a snapshot that only
touched them holds the same data as the one before it. (``runs``: a resumed stage rewrites its
run's status and times; its config, which names the run, does not change. Training and
evaluation bookkeeping never changes what a recipe selects.)"""
_DATA_CHANGES = ("tables_inserted_into", "tables_deleted_from", "inlined_insert", "inlined_delete")


def latest_data_snapshot(wh: Warehouse, ignore: tuple[str, ...] = BOOKKEEPING_TABLES) -> int:
    """The latest snapshot that changed data: writes to ``ignore`` tables only (registering a
    dataset, pinning a snapshot) do not count, so building the same recipe again without new
    data pins the same snapshot and gives the same dataset. Other kinds of change (tables or
    schemas created) count as data."""
    ignored = {
        str(t)
        for (t,) in wh.con.execute(
            f"SELECT table_id FROM __ducklake_metadata_{LAKE}.ducklake_table "
            "WHERE table_name IN (SELECT unnest(?))",
            [list(ignore)],
        ).fetchall()
    }
    snaps = wh.con.execute(
        f"SELECT snapshot_id, changes FROM {LAKE}.snapshots() ORDER BY snapshot_id DESC"
    ).fetchall()
    for sid, changes in snaps:
        kinds = dict(changes or {})
        if not kinds or any(k not in _DATA_CHANGES for k in kinds):
            return int(sid)
        touched = {str(t) for k in _DATA_CHANGES for t in kinds.get(k) or []}
        if touched - ignored:
            return int(sid)
    return current_snapshot(wh)


def pin(wh: Warehouse, reason: str, snapshot_id: int | None = None) -> Pin:
    """Pin a snapshot (default: the current one) so maintenance never expires it."""
    sid = current_snapshot(wh) if snapshot_id is None else int(snapshot_id)
    record = Pin(pin_id=make_id("pin", sid, reason), snapshot_id=sid, reason=reason)
    wh.write([record])
    return record


def pinned_snapshots(wh: Warehouse) -> set[int]:
    """Snapshot ids held by pins or datasets."""
    df = wh.sql(
        f"SELECT snapshot_id FROM {LAKE}.pins UNION SELECT snapshot_id FROM {LAKE}.datasets"
    )
    return {int(s) for s in df.get_column("snapshot_id").to_list() if s is not None}


@dataclass
class MaintenanceReport:
    """What :func:`maintain` did."""

    flushed_inlined: bool = False
    files_before: int = 0
    files_after: int = 0
    snapshots_expired: list[int] = field(default_factory=list)
    snapshots_kept_pinned: list[int] = field(default_factory=list)
    files_deleted: int = 0


def maintain(wh: Warehouse, keep_recent: dt.timedelta = dt.timedelta(hours=1)) -> MaintenanceReport:
    """Flush inlined data, merge small files, expire unpinned snapshots, delete unused files.

    Snapshots younger than ``keep_recent`` are kept too, so that a reader in another process
    that is still reading one of them is not cut off. The current snapshot is always kept.
    """
    rep = MaintenanceReport(files_before=_data_files(wh))
    wh.con.execute("CALL ducklake_flush_inlined_data(?)", [LAKE])
    rep.flushed_inlined = True
    wh.con.execute("CALL ducklake_merge_adjacent_files(?)", [LAKE])
    protected = pinned_snapshots(wh)
    cutoff = utcnow() - keep_recent
    latest = current_snapshot(wh)
    snaps = wh.sql(f"SELECT snapshot_id, snapshot_time FROM {LAKE}.snapshots()")
    expire = []
    for sid, when in snaps.iter_rows():
        if sid == latest or when > cutoff:
            continue
        if sid in protected:
            rep.snapshots_kept_pinned.append(int(sid))
        else:
            expire.append(int(sid))
    if expire:
        wh.con.execute("CALL ducklake_expire_snapshots(?, versions => ?)", [LAKE, expire])
    rep.snapshots_expired = expire
    deleted = wh.con.execute(
        "SELECT count(*) FROM ducklake_cleanup_old_files(?, cleanup_all => true)", [LAKE]
    ).fetchone()[0]
    rep.files_deleted = int(deleted)
    rep.files_after = _data_files(wh)
    return rep


def _data_files(wh: Warehouse) -> int:
    """Data files referenced by the current snapshot, over all tables."""
    total = 0
    for (table,) in wh.con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = ?", [LAKE]
    ).fetchall():
        total += wh.con.execute(
            "SELECT count(*) FROM ducklake_list_files(?, ?)", [LAKE, table]
        ).fetchone()[0]
    return int(total)
