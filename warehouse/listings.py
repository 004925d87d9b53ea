"""What the ``webloop`` CLI lists and shows, read from the warehouse tables: tasks, runs, a
judge's versions, datasets and their members, a checkpoint's evaluations.

Each function is one read-only query (values as parameters, never formatted into the SQL) and
returns plain values or a polars frame whose columns are the ones the command prints, so the
CLI imports neither DuckDB nor polars (an import-linter contract). The latest snapshot id is
:func:`warehouse.versions.current_snapshot`."""

from __future__ import annotations

from typing import Any

import polars as pl

from warehouse.store import Warehouse
from warehouse.tasks import latest_tasks

TASK_COLUMNS = ("task_id", "version", "site", "split", "difficulty", "instruction")
"""The columns of :func:`matching_tasks`, in order."""

_TASK_FILTER = (
    "($suite IS NULL OR suite = $suite) AND ($site IS NULL OR site = $site) "
    "AND ($split IS NULL OR split = $split) AND ($d IS NULL OR difficulty = $d) "
    "AND ($lo IS NULL OR difficulty >= $lo) AND ($hi IS NULL OR difficulty <= $hi)"
)


def matching_tasks(
    wh: Warehouse,
    *,
    suite: str | None = None,
    site: str | None = None,
    split: str | None = None,
    difficulty: int | None = None,
    min_difficulty: int | None = None,
    max_difficulty: int | None = None,
) -> pl.DataFrame:
    """The latest version of every task that passes all the given filters (None: no filter),
    sorted by ``task_id``; columns :data:`TASK_COLUMNS`.

    ``difficulty`` is exact; ``min_difficulty`` / ``max_difficulty`` are inclusive bounds. A
    task without a difficulty passes only when no difficulty filter is given."""
    params = {
        "suite": suite,
        "site": site,
        "split": split,
        "d": difficulty,
        "lo": min_difficulty,
        "hi": max_difficulty,
    }
    return latest_tasks(wh, _TASK_FILTER, params).sort("task_id").select(TASK_COLUMNS)


def run_exists(wh: Warehouse, run_id: str) -> bool:
    """Whether a run with id ``run_id`` is stored (of any kind and status)."""
    return bool(wh.sql("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).item())


def judge_versions(wh: Warehouse, judge: str) -> list[str]:
    """The distinct versions of ``judge`` that have judgments (errors included), sorted; empty
    when the judge has judged nothing."""
    df = wh.sql(
        "SELECT DISTINCT judge_version FROM judgments WHERE judge = ? ORDER BY 1",
        [judge],
    )
    return df["judge_version"].to_list()


def registered_datasets(wh: Warehouse) -> pl.DataFrame:
    """Every registered dataset, newest first (ties by ``dataset_id``); columns
    ``dataset_id``, ``name``, ``snapshot_id``, ``counts`` (the JSON text stored),
    ``export_path``, ``code_version``, ``created_at``."""
    return wh.sql(
        "SELECT dataset_id, name, snapshot_id, counts, export_path, code_version, "
        "created_at FROM datasets ORDER BY created_at DESC, dataset_id"
    )


def find_dataset(wh: Warehouse, ref: str) -> dict[str, Any] | None:
    """The dataset whose id is ``ref``, else the newest one named ``ref`` (None: neither), as
    its ``datasets`` row: every column by name (``recipe`` and ``counts`` as the JSON text
    stored)."""
    df = wh.sql(
        "SELECT * FROM datasets WHERE dataset_id = $r OR name = $r "
        "ORDER BY dataset_id = $r DESC, created_at DESC, dataset_id LIMIT 1",
        {"r": ref},
    )
    return None if df.is_empty() else df.row(0, named=True)


def dataset_names(wh: Warehouse) -> list[str]:
    """The distinct names of the registered datasets, sorted."""
    return wh.sql("SELECT DISTINCT name FROM datasets ORDER BY name")["name"].to_list()


def dataset_member_counts(wh: Warehouse, dataset_id: str) -> dict[str, int]:
    """How many members dataset ``dataset_id`` has: ``trajectories`` (whole-trajectory
    members) and ``steps`` (single-step members); both 0 for an unknown dataset."""
    return wh.sql(
        "SELECT count(*) FILTER (WHERE step_idx IS NULL) AS trajectories, "
        "count(*) FILTER (WHERE step_idx IS NOT NULL) AS steps "
        "FROM dataset_members WHERE dataset_id = ?",
        [dataset_id],
    ).row(0, named=True)


def dataset_member_diff(wh: Warehouse, old: str, new: str) -> pl.DataFrame:
    """The members dataset ``new`` adds to and removes from dataset ``old``
    (``warehouse/queries/dataset_member_diff.sql``): columns ``change`` (``added`` |
    ``removed``), ``traj_id``, ``step_idx`` (null: a whole-trajectory member), sorted by them
    (whole trajectory before its steps)."""
    return wh.query("dataset_member_diff", old=old, new=new)


def checkpoint_evaluations(wh: Warehouse, checkpoint_id: str) -> pl.DataFrame:
    """The evaluations of checkpoint ``checkpoint_id``, oldest first; columns
    ``evaluation_id``, ``suite``, ``split``, ``n``, ``success_rate``, ``ci_low``, ``ci_high``
    (the 95% interval of ``success_rate``). No rows for a checkpoint never evaluated."""
    return wh.sql(
        "SELECT evaluation_id, suite, split, n, success_rate, ci_low, ci_high "
        "FROM evaluations WHERE checkpoint_id = ? ORDER BY created_at",
        [checkpoint_id],
    )
