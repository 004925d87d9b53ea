"""Curriculum: per-task success history → sampling weight (DigiRL), horizon schedule (TTI).

History is counted over ALL trajectories of a task stored at the pinned snapshot (every run,
every policy), not just the selected ones: a task's difficulty is a property of the task.

- ``attempts``: trajectories with an outcome, status ``success`` or ``failure``. Infra errors,
  timeouts (time budget), running and ``finished`` (no outcome known yet) do not count.
- ``successes``: status ``success``; ``success_rate`` = successes / attempts (null: no attempt).

Weights:

- ``none``: 1.0 for every task.
- ``intermediate`` (DigiRL's curriculum: tasks the agent sometimes solves carry the most
  learning signal): ``max(FLOOR, 4·p·(1−p))``, which is 1.0 at p = 0.5 and falls to ``FLOOR``
  (0.1) for tasks always or never solved, so they are down-weighted, not dropped. A task
  never attempted weighs 1.0 (nothing known; treated as maximally informative).

Horizon (TTI): a recipe's ``curriculum.horizon`` lists the step budget of each RL iteration (a
flywheel round, an on-policy RL iteration), short first so an untrained policy's rollouts stay
cheap; :func:`horizon_at` reads it (the last budget repeats).
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from curation.filters import Lake
from warehouse.records import FAILURE, SUCCESS

FLOOR = 0.1
"""Smallest ``intermediate`` weight (tasks with success rate 0 or 1)."""

CURRICULUM_SCHEMA = {
    "task_id": pl.String,
    "attempts": pl.Int64,
    "successes": pl.Int64,
    "success_rate": pl.Float64,
    "weight": pl.Float64,
}


def task_history(lake: Lake, task_ids: list[str]) -> pl.DataFrame:
    """task_id, attempts, successes, success_rate for ``task_ids`` (sorted by task_id)."""
    t = Lake.table("trajectories")
    counted = lake.sql(
        f"""
        SELECT task_id,
               count(*) FILTER (WHERE status IN ($success, $failure)) AS attempts,
               count(*) FILTER (WHERE status = $success) AS successes
        FROM {t} WHERE list_contains($ids, task_id)
        GROUP BY task_id
        """,
        {"ids": task_ids, "success": SUCCESS, "failure": FAILURE},
    )
    base = pl.DataFrame({"task_id": task_ids}, schema={"task_id": pl.String}).unique()
    out = base.join(counted, on="task_id", how="left").with_columns(
        pl.col("attempts").fill_null(0).cast(pl.Int64),
        pl.col("successes").fill_null(0).cast(pl.Int64),
    )
    return out.with_columns(
        pl.when(pl.col("attempts") > 0)
        .then(pl.col("successes") / pl.col("attempts"))
        .otherwise(None)
        .cast(pl.Float64)
        .alias("success_rate")
    ).sort("task_id")


def weights(history: pl.DataFrame, mode: str) -> pl.DataFrame:
    """``history`` with a ``weight`` column for the curriculum ``mode`` (none | intermediate)."""
    if mode == "none":
        w = pl.lit(1.0)
    elif mode == "intermediate":
        p = pl.col("success_rate")
        w = pl.when(p.is_null()).then(1.0).otherwise(pl.max_horizontal(FLOOR, 4 * p * (1 - p)))
    else:
        raise ValueError(f"unknown curriculum weights {mode!r} (none | intermediate)")
    return history.with_columns(w.cast(pl.Float64).alias("weight")).select(list(CURRICULUM_SCHEMA))


def horizon_at(schedule: Sequence[int], iteration: int, default: int) -> int:
    """The step budget of RL iteration ``iteration`` (0-based: 0 is the first round) under the
    horizon ``schedule``: ``schedule[min(iteration, len(schedule) − 1)]``, the last budget
    repeating once the schedule runs out; ``default`` when the schedule is empty.

    ``horizon_at([5, 10, 20], i, d)`` for i = 0, 1, 2, 3, 4 → 5, 10, 20, 20, 20."""
    if iteration < 0:
        raise ValueError(f"horizon_at: iteration must be >= 0 (0 is the first), got {iteration}")
    if not schedule:
        return default
    return schedule[min(iteration, len(schedule) - 1)]
