"""select(): sources, pinned snapshot, balance caps, curriculum weights, includes.

Fixture: tests/curation/fixture.py. md5 order of the selectable trajectories (balance picks the
first N per group in this order): t02 35c2…, t06 471e…, t01 8626…, t13 9919…, t03 9e06…,
t12 a461…, t05 af16…, t04 d5cf…, t07 fd24….
"""

from __future__ import annotations

import hashlib

import polars as pl
import pytest

from curation.curriculum import FLOOR, task_history, weights
from curation.filters import Lake
from curation.select import TRAJECTORY_COLUMNS, select
from tests.curation.fixture import kept_steps, recipe_of, report_of, run
from warehouse.records import Step, Trajectory
from warehouse.versions import current_snapshot


def ids(sel) -> list[str]:
    return sel.trajectories.get_column("traj_id").to_list()


def test_md5_order_in_docstring_is_right() -> None:
    order = sorted(
        ["t01", "t02", "t03", "t04", "t05", "t06", "t07", "t12", "t13"],
        key=lambda t: hashlib.md5(t.encode()).hexdigest(),
    )
    assert order == ["t02", "t06", "t01", "t13", "t03", "t12", "t05", "t04", "t07"]


def test_selection_columns_and_types(shared_wh) -> None:
    sel = run(shared_wh, "filters: []\n")
    assert sel.trajectories.columns == [*TRAJECTORY_COLUMNS, "weight"]
    assert sel.trajectories.schema["weight"] == pl.Float64
    assert sel.steps.columns == ["traj_id", "step_idx"]
    assert sel.steps.equals(sel.steps.sort("traj_id", "step_idx"))
    row = sel.trajectories.filter(pl.col("traj_id") == "t07").row(0, named=True)
    assert row["task_id"] == "task-2" and row["site"] == "shop" and row["difficulty"] == 3
    assert row["instruction"] == "Put the blue kettle into your cart"
    assert row["group_id"] == "run-model/task-2" and row["policy"] == "openai:tiny"
    assert sel.snapshot_id == shared_wh[1].snapshot_id
    assert sel.horizon == []


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        # run by name; run by id → the expert run's train trajectories
        ("{runs: [expert-collect]}", ["t01", "t02", "t03", "t04"]),
        ("{runs: [run-expert]}", ["t01", "t02", "t03", "t04"]),
        # shell pattern on policy
        ("{policies: ['openai*']}", ["t05", "t06", "t07", "t12", "t13"]),
        # the test split: t11 only
        ("{splits: [test]}", ["t11"]),
        # all splits: t11 joins the 9
        ("{splits: []}", ["t01", "t02", "t03", "t04", "t05", "t06", "t07", "t11", "t12", "t13"]),
        ("{suites: [bundled], splits: [train, test]}", None),
        # created_at = T0 + k minutes, k = position in id order (t11 is k=10, t12 11, t13 12)
        ("{since: '2026-01-01T00:11:00Z'}", ["t12", "t13"]),
        ("{until: '2026-01-01T00:02:00Z'}", ["t01", "t02"]),
    ],
)
def test_sources(shared_wh, sources: str, expected: list[str] | None) -> None:
    sel = run(shared_wh, f"sources: {sources}\n")
    if expected is None:  # same as all splits
        expected = ["t01", "t02", "t03", "t04", "t05", "t06", "t07", "t11", "t12", "t13"]
    assert ids(sel) == expected


def test_reads_at_the_pinned_snapshot(fixture_wh) -> None:
    wh, fx = fixture_wh
    wh.write_trajectories(
        [Trajectory("t14", "run-expert", "task-1", "expert", "success", task_version=1, n_steps=1)],
        [Step("t14", 0, screenshot_hash=fx.screens["s1"], action_text="click(e1)")],
    )
    recipe = recipe_of("filters: []\n")
    pinned = select(wh, recipe, snapshot_id=fx.snapshot_id)
    now = select(wh, recipe, snapshot_id=current_snapshot(wh))
    assert "t14" not in ids(pinned) and len(ids(pinned)) == 9
    assert "t14" in ids(now) and len(ids(now)) == 10
    # history too: task-1 had 3 attempts (t01 t02 t05) at the pin, 4 now
    assert pinned.curriculum.filter(pl.col("task_id") == "task-1")["attempts"].item() == 3
    assert now.curriculum.filter(pl.col("task_id") == "task-1")["attempts"].item() == 4


def test_balance_per_site(shared_wh) -> None:
    sel = run(shared_wh, "balance: {per_site: 2}\n")
    # shop t01 t02 t05 t07 → first 2 by md5: t02 t01 (t05 4 steps, t07 2 go);
    # travel t03 t06 t12 → t06 t03 (t12, 12 steps, goes); wiki t04 t13 → both stay.
    assert report_of(sel)[1:] == [("balance.per_site", 3, 18)]
    assert ids(sel) == ["t01", "t02", "t03", "t04", "t06", "t13"]
    assert run(shared_wh, "balance: {per_site: 2}\n").trajectories.equals(sel.trajectories)


def test_balance_per_task(shared_wh) -> None:
    sel = run(shared_wh, "balance: {per_task: 1}\n")
    # task-1 → t02; task-2 → t07; task-3 → t06; task-4 → t13. Removed t01 3, t03 4, t04 2,
    # t05 4, t12 12 = 5 trajs, 25 steps.
    assert report_of(sel)[1:] == [("balance.per_task", 5, 25)]
    assert ids(sel) == ["t02", "t06", "t07", "t13"]


def test_balance_per_difficulty(shared_wh) -> None:
    sel = run(shared_wh, "balance: {per_difficulty: 2}\n")
    # difficulty 2 (task-1, task-3): t02 t06 stay, t01 t03 t05 t12 go (3+4+4+12 = 23 steps);
    # difficulty 1 (task-4): t04 t13; difficulty 3: t07.
    assert report_of(sel)[1:] == [("balance.per_difficulty", 4, 23)]
    assert ids(sel) == ["t02", "t04", "t06", "t07", "t13"]


def test_balance_caps_apply_task_then_difficulty_then_site(shared_wh) -> None:
    sel = run(shared_wh, "balance: {per_site: 1, per_task: 2}\n")
    # per_task 2: t05 (4) and t12 (12) go. per_site 1 on what is left: shop t02 (t01 3, t07 2
    # go), travel t06 (t03 4 goes), wiki t13 (t04 2 goes).
    assert report_of(sel)[1:] == [("balance.per_task", 2, 16), ("balance.per_site", 4, 11)]
    assert ids(sel) == ["t02", "t06", "t13"]


def test_curriculum_intermediate_weights(shared_wh) -> None:
    sel = run(shared_wh, "curriculum: {weights: intermediate, horizon: [5, 10, 20]}\n")
    cur = {r["task_id"]: r for r in sel.curriculum.iter_rows(named=True)}
    # over ALL trajectories of each task at the snapshot (infra/timeout/running not attempts):
    # task-1: t01 s, t02 s, t05 f → 2/3 → 4·(2/3)(1/3) = 8/9
    # task-2: t07 s → 1/1 → floor 0.1
    # task-3: t03 s, t06 s, t12 f → 8/9
    # task-4: t04 s, t13 f (t08 infra, t09 timeout, t10 running ignored) → 1/2 → 1.0
    assert {t: (r["attempts"], r["successes"]) for t, r in cur.items()} == {
        "task-1": (3, 2),
        "task-2": (1, 1),
        "task-3": (3, 2),
        "task-4": (2, 1),
    }
    assert cur["task-1"]["weight"] == pytest.approx(8 / 9)
    assert cur["task-2"]["weight"] == pytest.approx(FLOOR)
    assert cur["task-3"]["weight"] == pytest.approx(8 / 9)
    assert cur["task-4"]["weight"] == pytest.approx(1.0)
    w = dict(sel.trajectories.select("traj_id", "weight").iter_rows())
    assert w["t07"] == pytest.approx(0.1) and w["t13"] == pytest.approx(1.0)
    assert w["t01"] == pytest.approx(8 / 9)
    assert sel.horizon == [5, 10, 20]


def test_curriculum_history_counts_unselected_trajectories(shared_wh) -> None:
    # The verdict filter leaves only t07 for task-2… and t01/t02 for task-1, but task-1's
    # history still counts t05's failure.
    sel = run(
        shared_wh,
        "filters: [{verdict: {judges: [programmatic]}}]\ncurriculum: {weights: intermediate}\n",
    )
    row = sel.curriculum.filter(pl.col("task_id") == "task-1").row(0, named=True)
    assert (row["attempts"], row["successes"]) == (3, 2)
    assert sel.curriculum.get_column("task_id").to_list() == [
        "task-1",
        "task-2",
        "task-3",
        "task-4",
    ]


def test_curriculum_none_and_unattempted(shared_wh) -> None:
    sel = run(shared_wh, "filters: []\n")
    assert sel.curriculum.get_column("weight").to_list() == [1.0, 1.0, 1.0, 1.0]
    assert set(sel.trajectories.get_column("weight").to_list()) == {1.0}
    wh, fx = shared_wh
    hist = task_history(Lake(wh, fx.snapshot_id), ["task-4", "never-run"])
    rows = {r["task_id"]: r for r in hist.iter_rows(named=True)}
    assert rows["never-run"]["attempts"] == 0 and rows["never-run"]["success_rate"] is None
    weighted = weights(hist, "intermediate")
    assert dict(weighted.select("task_id", "weight").iter_rows()) == {
        "never-run": 1.0,
        "task-4": 1.0,
    }
    synthetic = pl.DataFrame(
        {"task_id": ["a", "b", "c"], "attempts": [4, 4, 4], "successes": [0, 1, 4]},
        schema_overrides={"attempts": pl.Int64, "successes": pl.Int64},
    ).with_columns(success_rate=pl.col("successes") / pl.col("attempts"))
    got = weights(synthetic, "intermediate").get_column("weight").to_list()
    assert got == pytest.approx([FLOOR, 0.75, FLOOR])  # p = 0, 0.25, 1


def test_include_interventions(shared_wh) -> None:
    sel = run(
        shared_wh,
        "filters: [{verdict: {judges: [programmatic]}}]\ninclude: {interventions: true}\n",
    )
    # verified: iv-05 (t05), iv-13 (t13) — failed trajectories of the sources, though the
    # verdict filter removed them; iv-12 is not verified; iv-11's t11 is outside the sources.
    assert sel.interventions.get_column("intervention_id").to_list() == ["iv-05", "iv-13"]
    assert {"proposed_action", "first_error_step", "verified_outcome", "reference"} <= set(
        sel.interventions.columns
    )
    off = run(shared_wh, "filters: []\n")
    assert off.interventions.height == 0
    assert off.interventions.columns == sel.interventions.columns


def test_include_rationales_of_kept_steps(shared_wh) -> None:
    sel = run(
        shared_wh,
        "filters: [{prm_threshold: {scorer: exact, min_score: 0.5, unscored: keep}}]\n"
        "include: {rationales: teacher-a}\n",
    )
    # teacher-a: t01 0,1,2 and t03 1; t03 step 1 (PRM 0.2) is dropped → 3 rows.
    assert [(t, i) for t, i, _ in sel.rationales.iter_rows()] == [
        ("t01", 0),
        ("t01", 1),
        ("t01", 2),
    ]
    assert sel.rationales.row(0)[2] == "teacher-a on t01#0"
    assert run(shared_wh, "filters: []\n").rationales.height == 0


def test_emptied_trajectory_counts_under_the_step_filter(fixture_wh) -> None:
    wh, fx = fixture_wh
    # t15: one invalid step only → drop_invalid_steps removes the step AND the trajectory
    wh.write_trajectories(
        [Trajectory("t15", "run-model", "task-4", "openai:tiny", "failure", n_steps=1)],
        [Step("t15", 0, screenshot_hash=fx.screens["s8"], action_error="boom")],
    )
    sel = select(
        wh, recipe_of("filters: [{drop_invalid_steps: {}}]\n"), snapshot_id=current_snapshot(wh)
    )
    assert report_of(sel)[1] == ("drop_invalid_steps", 1, 4)  # t15 (1) + t05's 3
    assert "t15" not in ids(sel)
    assert kept_steps(sel)["t05"] == [3]
