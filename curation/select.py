"""Selection: a recipe applied to the warehouse at a pinned snapshot.

:func:`select` reads the trajectories of the recipe's ``sources`` (joined with their tasks) and
all their stored steps at ``snapshot_id``, then applies, in order, each reported as a
:class:`FilterReport`:

1. ``exclude_infra`` (always): status infra_error / timeout / running.
2. the recipe's ``filters`` (curation/filters.py), in the order written;
3. balance caps ``balance.per_task``, ``balance.per_difficulty``, ``balance.per_site`` (in that
   order, only those set): at most N trajectories per group, the first N by md5(traj_id), so
   the choice is deterministic and unrelated to ids' alphabetical order.

A step filter that removes every step of a trajectory removes the trajectory too (counted
under that filter); a removed trajectory's kept steps count as steps removed. Then the
curriculum weights the selected tasks (curation/curriculum.py), and the interventions and
rationales asked for by ``include`` are read.

Everything is columnar: polars frames and DuckDB SQL over the lake, never a Python object per
step.

Decisions where the spec left room (the names and columns are as specified):

- Trajectory ``n_steps`` is the recorded step count; the kept steps are in ``steps``.
- ``prm_threshold``: the taken action has no candidate index of its own (candidates are
  sampled separately); its score is that of a candidate with the same action text at that
  state, and unscored steps are dropped by default (``unscored: keep`` keeps them).
- ``drop_loops`` works on steps (the repeats after ``max_repeats``), not whole trajectories.
- ``length`` bounds the recorded ``n_steps``, not the steps left by earlier step filters.
- include.interventions: verified interventions of the selected trajectories and of every
  ``failure`` trajectory of the sources (after exclude_infra), whatever later filters did.
- Curriculum attempts count status success/failure only (see curriculum.py).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl

from curation.curriculum import CURRICULUM_SCHEMA, task_history, weights
from curation.filters import Frames, Lake, apply_filter, exclude_infra
from curation.recipe import Recipe, Sources
from warehouse.records import FAILURE
from warehouse.store import Warehouse

TRAJECTORY_COLUMNS = [
    "traj_id",
    "run_id",
    "task_id",
    "policy",
    "status",
    "group_id",
    "n_steps",
    "answer",
    "suite",
    "site",
    "split",
    "difficulty",
    "instruction",
]
RATIONALE_SCHEMA = {"traj_id": pl.String, "step_idx": pl.Int64, "thought": pl.String}


@dataclass
class FilterReport:
    """What one filter removed: trajectories, and steps (kept steps of removed trajectories
    included)."""

    name: str
    params: dict
    trajectories_removed: int
    steps_removed: int


@dataclass
class Selection:
    """The result of a recipe at a snapshot.

    ``trajectories``: traj_id, run_id, task_id, policy, status, group_id, n_steps, answer,
    suite, site, split, difficulty, instruction, weight (f64, the task's curriculum weight);
    sorted by traj_id. ``steps``: traj_id, step_idx of the KEPT steps, sorted.
    ``interventions``: Intervention columns, verified ones (empty unless include.interventions).
    ``rationales``: traj_id, step_idx, thought of the kept steps by include.rationales' teacher.
    ``curriculum``: task_id, attempts, successes, success_rate, weight of the selected tasks.
    ``horizon``: the recipe's horizon schedule. ``report``: one FilterReport per filter applied,
    first ``exclude_infra``. ``snapshot_id``: the snapshot everything was read at.
    """

    trajectories: pl.DataFrame
    steps: pl.DataFrame
    interventions: pl.DataFrame
    rationales: pl.DataFrame
    curriculum: pl.DataFrame
    horizon: list[int]
    report: list[FilterReport]
    snapshot_id: int


def select(wh: Warehouse, recipe: Recipe, *, snapshot_id: int) -> Selection:
    """Apply ``recipe`` to the warehouse as it was at ``snapshot_id``."""
    lake = Lake(wh, snapshot_id)
    trajs = scoped_trajectories(lake, recipe.sources)
    steps = steps_of(lake, trajs.get_column("traj_id"))
    frames = Frames(trajs, steps, pl.Series("kept", [True] * steps.height, pl.Boolean), lake)
    report: list[FilterReport] = []
    frames = _applied(frames, report, "exclude_infra", {}, exclude_infra)
    failed = frames.trajectories.filter(pl.col("status") == FAILURE).get_column("traj_id")
    for f in recipe.filters:
        params = f.params.model_dump(mode="json")
        frames = _applied(frames, report, f.name, params, _runner(f.name, f.params))
    for column in ("task", "difficulty", "site"):
        cap = getattr(recipe.balance, f"per_{column}")
        if cap is not None:
            key = "task_id" if column == "task" else column
            frames = _applied(frames, report, f"balance.per_{column}", {"cap": cap}, _cap(key, cap))

    tasks = frames.trajectories.get_column("task_id").unique().sort().to_list()
    curriculum = weights(task_history(lake, tasks), recipe.curriculum.weights)
    selected = (
        frames.trajectories.join(curriculum.select("task_id", "weight"), on="task_id", how="left")
        .with_columns(pl.col("weight").fill_null(1.0))
        .select([*TRAJECTORY_COLUMNS, "weight"])
        .sort("traj_id")
    )
    kept = frames.steps.filter(frames.kept).select("traj_id", "step_idx")
    ids = selected.get_column("traj_id")
    return Selection(
        trajectories=selected,
        steps=kept,
        interventions=_interventions(lake, ids, failed, recipe.include.interventions),
        rationales=_rationales(lake, kept, recipe.include.rationales),
        curriculum=curriculum.cast(CURRICULUM_SCHEMA),  # type: ignore[arg-type]
        horizon=list(recipe.curriculum.horizon),
        report=report,
        snapshot_id=int(snapshot_id),
    )


# -- reading -----------------------------------------------------------------------------------


def scoped_trajectories(lake: Lake, src: Sources) -> pl.DataFrame:
    """The trajectories of ``src`` with their task's columns (the task version the trajectory
    ran: ``trajectory_tasks`` of :mod:`warehouse.relations`; null when that version is not
    stored), plus ``_order`` (md5 of traj_id, for balance)."""
    conds, params = ["TRUE"], {}
    if src.suites:
        conds.append("list_contains($suites, k.suite)")
        params["suites"] = list(src.suites)
    if src.splits:
        conds.append("list_contains($splits, k.split)")
        params["splits"] = list(src.splits)
    if src.runs:
        conds.append("list_contains($runs, t.run_id)")
        params["runs"] = _run_ids(lake, list(src.runs))
    if src.policies:
        conds.append("list_contains($policies, t.policy)")
        params["policies"] = _policies(lake, src)
    if src.since is not None:
        conds.append("t.created_at >= $since")
        params["since"] = src.since
    if src.until is not None:
        conds.append("t.created_at < $until")
        params["until"] = src.until
    query = f"""
        SELECT t.traj_id, t.run_id, t.task_id, t.policy, t.status, t.group_id, t.n_steps,
               t.answer, k.suite, k.site, k.split, k.difficulty, k.instruction,
               md5(t.traj_id) AS _order
        FROM {Lake.table("trajectories", "t")} LEFT JOIN trajectory_tasks k USING (traj_id)
        WHERE {" AND ".join(conds)}
        ORDER BY t.traj_id
    """
    return lake.sql(query, params)


def steps_of(lake: Lake, traj_ids: pl.Series) -> pl.DataFrame:
    """Every stored step of ``traj_ids``, sorted by (traj_id, step_idx), with the columns the
    filters need (no model output, no blobs)."""
    t = Lake.table("steps", "s")
    return lake.with_ids(
        "__scoped_trajs",
        traj_ids,
        f"""
        SELECT s.traj_id, s.step_idx, s.url, s.screenshot_hash, s.action_text, s.action_error,
            coalesce(s.screenshot_hash, s.a11y_hash) AS obs_hash
        FROM {t} WHERE s.traj_id IN (SELECT traj_id FROM __scoped_trajs)
        ORDER BY s.traj_id, s.step_idx
        """,
    )


def _run_ids(lake: Lake, runs: list[str]) -> list[str]:
    """Run ids for ids or names (values no run has are kept: trajectories may carry them)."""
    found = lake.sql(
        f"SELECT run_id FROM {Lake.table('runs')} "
        "WHERE list_contains($r, run_id) OR list_contains($r, name)",
        {"r": runs},
    )
    return sorted(set(runs) | set(found.get_column("run_id").to_list()))


def _policies(lake: Lake, src: Sources) -> list[str]:
    """The stored policy names matching the recipe's policies (exact or shell pattern)."""
    df = lake.sql(f"SELECT DISTINCT policy FROM {Lake.table('trajectories')}")
    names = df.get_column("policy").to_list()
    return sorted(n for n in names if any(fnmatch.fnmatchcase(n, p) for p in src.policies))


def _interventions(lake: Lake, selected: pl.Series, failed: pl.Series, on: bool) -> pl.DataFrame:
    ids = pl.concat([selected, failed]).unique() if on else selected.clear()
    return lake.with_ids(
        "__iv_trajs",
        ids,
        f"SELECT * FROM {Lake.table('interventions')} "
        "WHERE verified AND traj_id IN (SELECT traj_id FROM __iv_trajs) "
        "ORDER BY traj_id, intervention_id",
    )


def _rationales(lake: Lake, kept: pl.DataFrame, teacher: str | None) -> pl.DataFrame:
    if teacher is None or kept.height == 0:
        return pl.DataFrame(schema=RATIONALE_SCHEMA)
    lake.wh.con.register("__kept_steps", kept.to_arrow())
    try:
        out = lake.sql(
            f"SELECT r.traj_id, r.step_idx, r.thought FROM {Lake.table('rationales', 'r')} "
            "SEMI JOIN __kept_steps k ON r.traj_id = k.traj_id AND r.step_idx = k.step_idx "
            "WHERE r.teacher = $teacher ORDER BY r.traj_id, r.step_idx",
            {"teacher": teacher},
        )
    finally:
        lake.wh.con.unregister("__kept_steps")
    return out.cast(RATIONALE_SCHEMA)  # type: ignore[arg-type]


# -- applying ----------------------------------------------------------------------------------


def _runner(name: str, params: Any) -> Callable[[Frames], Frames]:
    return lambda frames: apply_filter(name, frames, params)


def _cap(column: str, cap: int) -> Callable[[Frames], Frames]:
    def run(frames: Frames) -> Frames:
        rank = pl.col("_order").rank("ordinal").over(column)
        return frames.keep_trajectories(rank <= cap)

    return run


def _applied(
    frames: Frames, report: list[FilterReport], name: str, params: dict, fn: Callable
) -> Frames:
    """Run ``fn``, drop trajectories it left without steps, record what was removed."""
    t0, s0 = frames.trajectories.height, int(frames.kept.sum())
    out: Frames = fn(frames)
    stored = frames.steps.get_column("traj_id")
    ids = stored.unique()
    emptied = ids.filter(~ids.is_in(stored.filter(out.kept).unique().implode()))
    if emptied.len():
        out = out.keep_trajectories(~pl.col("traj_id").is_in(emptied.implode()))
    report.append(
        FilterReport(name, params, t0 - out.trajectories.height, s0 - int(out.kept.sum()))
    )
    return out
