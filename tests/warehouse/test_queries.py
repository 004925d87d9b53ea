"""Analytic queries against hand-computed values."""

from __future__ import annotations

import pytest

from warehouse import Warehouse, WarehouseError
from warehouse.records import Judgment, Step, Task, Trajectory


@pytest.fixture
def filled(wh: Warehouse) -> Warehouse:
    wh.write(
        [
            Task(
                task_id="s1",
                suite="bundled",
                site="shop",
                split="train",
                instruction="i",
                start_url="u",
            ),
            Task(
                task_id="w1",
                suite="bundled",
                site="wiki",
                split="test",
                instruction="i",
                start_url="u",
            ),
        ]
    )
    statuses = {
        "a": "success",
        "b": "failure",
        "c": "success",
        "d": "infra_error",
        "e": "finished",
        "f": "running",
    }
    trajs, steps = [], []
    for i, (tid, status) in enumerate(statuses.items()):
        task = "s1" if tid in "abcd" else "w1"
        trajs.append(
            Trajectory(
                traj_id=tid,
                run_id="r",
                task_id=task,
                policy="expert",
                status=status,
                n_steps=i + 1,
                duration_s=float(i),
            )
        )
        steps += [
            Step(traj_id=tid, step_idx=k, action_error="bad" if k == 0 and tid == "b" else None)
            for k in range(i + 1)
        ]
    wh.write_trajectories(trajs, steps)
    wh.write(
        [
            Judgment(
                judgment_id="j1", traj_id="e", judge="rubric", judge_version="1", verdict="success"
            ),
            Judgment(
                judgment_id="j2", traj_id="a", judge="rubric", judge_version="1", verdict="failure"
            ),
            Judgment(
                judgment_id="j3",
                traj_id="c",
                judge="rubric",
                judge_version="1",
                error="unparseable output",
            ),
        ]
    )
    return wh


def test_success_by_uses_status_and_leaves_infra_errors_out(filled: Warehouse):
    rows = {(r["site"], r["split"]): r for r in filled.query("success_by").to_dicts()}
    shop = rows[("shop", "train")]
    assert (shop["trajectories"], shop["decided"], shop["success"]) == (4, 3, 2)
    assert shop["infra_or_timeout"] == 1
    assert shop["success_rate"] == pytest.approx(2 / 3, abs=1e-4)
    wiki = rows[("wiki", "test")]
    assert (wiki["trajectories"], wiki["decided"], wiki["success_rate"]) == (2, 0, None)


def test_success_by_a_judge_ignores_judge_errors(filled: Warehouse):
    rows = {r["site"]: r for r in filled.query("success_by", judge="rubric").to_dicts()}
    assert (rows["shop"]["decided"], rows["shop"]["success"]) == (1, 0)  # a: failure; c: error
    assert (rows["wiki"]["decided"], rows["wiki"]["success"]) == (1, 1)  # e: success


def test_trajectory_summary(filled: Warehouse):
    (row,) = filled.query("trajectory_summary").to_dicts()
    assert row["trajectories"] == 6 and row["steps"] == 21
    assert (row["success"], row["failure"], row["unjudged"], row["running"]) == (2, 1, 1, 1)
    assert row["infra_or_timeout"] == 1 and row["invalid_actions"] == 1
    assert row["success_rate"] == pytest.approx(2 / 3, abs=1e-4)
    assert row["mean_steps"] == pytest.approx(3.5)


def test_unknown_query_and_parameter_are_clear_errors(wh: Warehouse):
    with pytest.raises(WarehouseError, match="no query named 'nope'"):
        wh.query("nope")
    with pytest.raises(WarehouseError, match="takes no parameter"):
        wh.query("trajectory_summary", site="x")
