"""Pins keep a version readable through maintenance; unpinned history is expired."""

from __future__ import annotations

import datetime as dt

import duckdb
import pytest

from warehouse import Warehouse
from warehouse.records import Run, Step, Trajectory
from warehouse.versions import current_snapshot, maintain, pin, pinned_snapshots


def write_batch(wh: Warehouse, b: int, status: str = "success") -> None:
    t = Trajectory(
        traj_id=f"t{b}", run_id="r", task_id=f"task{b}", policy="p", status=status, n_steps=2
    )
    wh.write_trajectories(
        [t], [Step(traj_id=f"t{b}", step_idx=i, url=f"u{b}.{i}") for i in range(2)]
    )


def test_pinned_version_stays_readable_after_maintenance(wh: Warehouse):
    for b in range(12):  # many small files to merge
        write_batch(wh, b)
    p = pin(wh, "dataset v1")
    before_t = wh.read(Trajectory, version=p.snapshot_id).sort("traj_id")
    before_s = wh.read(Step, version=p.snapshot_id).sort("traj_id", "step_idx")
    # change history after the pin: new rows, an update, a delete
    for b in range(12, 20):
        write_batch(wh, b)
    write_batch(wh, 0, status="failure")
    wh.con.execute("DELETE FROM steps WHERE traj_id = 't1'")
    unpinned = current_snapshot(wh)
    write_batch(wh, 99)

    rep = maintain(wh, keep_recent=dt.timedelta(0))

    assert p.snapshot_id in rep.snapshots_kept_pinned
    assert unpinned in rep.snapshots_expired
    assert rep.files_after < rep.files_before  # small files were merged
    assert wh.read(Trajectory, version=p.snapshot_id).sort("traj_id").equals(before_t)
    assert wh.read(Step, version=p.snapshot_id).sort("traj_id", "step_idx").equals(before_s)
    assert wh.count(Trajectory) == 21  # the current state is intact too
    assert wh.read(Trajectory, "traj_id = 't0'")["status"].to_list() == ["failure"]
    with pytest.raises(duckdb.Error):
        wh.read(Trajectory, version=unpinned)  # expired: gone


def test_recent_snapshots_are_kept(wh: Warehouse):
    wh.write([Run(run_id="a", kind="k")])
    old = current_snapshot(wh)
    wh.write([Run(run_id="b", kind="k")])
    rep = maintain(wh, keep_recent=dt.timedelta(hours=1))
    assert rep.snapshots_expired == []
    assert wh.read(Run, version=old).height == 1


def test_datasets_pin_their_snapshot(wh: Warehouse):
    from warehouse.records import Dataset

    wh.write([Run(run_id="a", kind="k")])
    sid = current_snapshot(wh)
    wh.write([Dataset(dataset_id="d1", name="d", snapshot_id=sid)])
    assert sid in pinned_snapshots(wh)


def test_latest_data_snapshot_skips_bookkeeping_writes(wh):
    from warehouse.records import Dataset, Run, Task
    from warehouse.versions import current_snapshot, latest_data_snapshot, pin

    wh.write([Task(task_id="t1", suite="s", instruction="do", start_url="http://x", version=1)])
    data = current_snapshot(wh)
    assert latest_data_snapshot(wh) == data
    pin(wh, "a dataset")
    wh.write([Dataset(dataset_id="d1", name="d", snapshot_id=data)])
    wh.write([Run(run_id="r1", kind="collect", status="completed")])  # a resumed run's record
    assert current_snapshot(wh) > data  # three more snapshots, none of them data
    assert latest_data_snapshot(wh) == data
    wh.write([Task(task_id="t2", suite="s", instruction="do", start_url="http://x", version=1)])
    assert latest_data_snapshot(wh) == current_snapshot(wh) > data
