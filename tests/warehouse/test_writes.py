"""Idempotent, transactional writes."""

from __future__ import annotations

import dataclasses

import duckdb
import polars as pl
import pytest

from warehouse import Warehouse, WarehouseError
from warehouse.records import HumanLabel, Run, Step, Task, Trajectory
from warehouse.versions import current_snapshot


def traj(tid: str = "t1", status: str = "success", n: int = 3, **kw) -> Trajectory:
    return Trajectory(
        traj_id=tid, run_id="r1", task_id="task", policy="p", status=status, n_steps=n, **kw
    )


def steps(tid: str = "t1", n: int = 3, tag: str = "a") -> list[Step]:
    return [Step(traj_id=tid, step_idx=i, action_text=f"{tag}{i}") for i in range(n)]


def test_writing_the_same_trajectory_twice_leaves_one_copy(wh: Warehouse):
    first = wh.write_trajectories([traj()], steps())
    assert first.inserted == 4
    snap = current_snapshot(wh)
    again = wh.write_trajectories([traj()], steps())
    assert again.inserted == 0 and again.updated == 0
    assert wh.count(Trajectory) == 1 and wh.count(Step) == 3
    # ... even from another process-like fresh connection that has no memory of the first write
    other = Warehouse.open(wh.cfg)
    assert other.write_trajectories([traj()], steps()).inserted == 0
    other.close()
    assert wh.count(Step) == 3
    assert current_snapshot(wh) == snap  # unchanged rows are not rewritten


def test_an_unfinished_trajectory_is_replaced_with_its_new_steps(wh: Warehouse):
    wh.write_trajectories([traj(status="running", n=5)], steps(n=5, tag="old"))
    wh.write_trajectories([traj(status="failure", n=2)], steps(n=2, tag="new"))
    rows = wh.read(Step, "traj_id = ?", ["t1"]).sort("step_idx")
    assert rows["action_text"].to_list() == ["new0", "new1"]
    t = wh.records(Trajectory)
    assert [(x.status, x.n_steps) for x in t] == [("failure", 2)]


def test_upsert_updates_a_changed_row_and_reports_it(wh: Warehouse):
    run = Run(run_id="r1", kind="collect", status="running")
    assert wh.write([run]).inserted == 1
    done = dataclasses.replace(run, status="completed")
    result = wh.write([done])
    assert (result.inserted, result.updated) == (0, 1)
    assert wh.records(Run)[0].status == "completed"
    assert wh.write([done]).updated == 0


def test_insert_mode_keeps_the_first_copy(wh: Warehouse):
    t = Task(task_id="a", suite="s", instruction="one", start_url="http://x")
    wh.write([t])
    wh.write([dataclasses.replace(t, instruction="two")])
    assert [r.instruction for r in wh.records(Task)] == ["one"]


def test_duplicate_keys_within_one_batch_keep_the_last(wh: Warehouse):
    a = HumanLabel(label_id="l1", traj_id="t", label="failure", reviewer="r")
    b = dataclasses.replace(a, label="success")
    wh.write([a, b])
    assert [r.label for r in wh.records(HumanLabel)] == ["success"]


def test_null_key_parts_still_match(wh: Warehouse):
    from warehouse.records import DatasetMember

    m = DatasetMember(dataset_id="d", traj_id="t", step_idx=None)
    wh.write([m])
    wh.write([dataclasses.replace(m, weight=2.0)])
    assert [r.weight for r in wh.records(DatasetMember)] == [2.0]


def test_write_many_is_one_transaction(wh: Warehouse):
    good = Run(run_id="r1", kind="collect")
    bad = pl.DataFrame(
        {
            "traj_id": ["t1"],
            "run_id": [None],
            "task_id": ["x"],
            "policy": ["p"],
            "status": ["success"],
        }
    )  # run_id NOT NULL
    with pytest.raises(duckdb.Error, match="NOT NULL"):
        wh.write_many([([good], Run), (bad, Trajectory)])
    assert wh.count(Run) == 0  # the first table's rows were rolled back too


def test_frames_write_like_records(wh: Warehouse):
    frame = pl.DataFrame({"traj_id": ["t1", "t1"], "step_idx": [0, 1], "url": ["u0", "u1"]})
    assert wh.write(frame, Step).inserted == 2
    assert wh.read(Step).sort("step_idx")["url"].to_list() == ["u0", "u1"]
    with pytest.raises(ValueError, match="needs its record type"):
        wh.write(frame)


def test_steps_for_a_trajectory_not_in_the_write_are_refused(wh: Warehouse):
    with pytest.raises(WarehouseError, match="steps given for trajectories not in this write"):
        wh.write_trajectories([traj("t1")], steps("t2"))
    assert wh.count(Step) == 0


def test_mixed_record_types_in_one_write_are_refused(wh: Warehouse):
    with pytest.raises(ValueError, match="one record type per write"):
        wh.write([Run(run_id="r", kind="k"), traj()])


def test_read_only_warehouse_refuses_writes(wh: Warehouse):
    wh.write([Run(run_id="r1", kind="collect")])
    ro = Warehouse.open(wh.cfg, read_only=True)
    assert ro.count(Run) == 1
    with pytest.raises(duckdb.Error, match=r"read-only|read only"):
        ro.write([Run(run_id="r2", kind="collect")])
    ro.close()


def test_a_trajectory_deleted_elsewhere_is_written_again_with_its_steps(wh: Warehouse):
    wh.write_trajectories([traj()], steps())
    other = Warehouse.open(wh.cfg)
    other.con.execute("DELETE FROM steps")
    other.con.execute("DELETE FROM trajectories")
    other.close()
    wh.write_trajectories([traj()], steps())  # this connection still remembers t1
    assert wh.count(Trajectory) == 1 and wh.count(Step) == 3


def _threads(wh: Warehouse) -> int:
    return int(wh.con.execute("SELECT current_setting('threads')").fetchone()[0])


def test_appends_run_on_one_thread_until_the_next_query(wh: Warehouse):
    wh.con.execute("SET threads = 2")
    wh.write_trajectories([traj("t1")], steps("t1"))
    assert _threads(wh) == 1  # lowered for the append ...
    wh.write_trajectories([traj("t2")], steps("t2"))
    assert _threads(wh) == 1  # ... and left lowered for the next one
    assert wh.sql("SELECT count(*) FROM steps").item() == 6
    assert _threads(wh) == 2  # a query gets its threads back
    wh.write_trajectories([traj("t3")], steps("t3"))
    wh.write([Run(run_id="r9", kind="collect")])  # so does any other write
    assert _threads(wh) == 2
    assert wh.count(Trajectory) == 3 and wh.count(Step) == 9
