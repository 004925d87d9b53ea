"""What the example renderer reads from the warehouse, at the selection's pinned snapshot.

Steps of a set of trajectories (ordered by trajectory and step), their runs' stored configs,
their task details (the task version each trajectory ran), and the PRM-scored candidates of
their steps. Trajectory ids go to DuckDB as a registered Arrow table, not as SQL text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import polars as pl
import pyarrow as pa

from warehouse.connection import LAKE
from warehouse.relations import with_relations
from warehouse.store import Warehouse

_STEP_COLS = (
    "traj_id, step_idx, url, title, screenshot_hash, a11y_hash, prompt_hash, model_output, "
    "action_text, action_error"
)


def _register_ids(wh: Warehouse, name: str, ids: Sequence[str]) -> None:
    wh.con.register(name, pa.table({"traj_id": pa.array(list(ids), pa.string())}))


def read_steps(wh: Warehouse, traj_ids: Sequence[str], snapshot_id: int) -> pl.DataFrame:
    """Every stored step of ``traj_ids`` at the snapshot, ordered by (traj_id, step_idx)."""
    _register_ids(wh, "__curation_ids", traj_ids)
    try:
        return wh.sql(
            f"SELECT {_STEP_COLS} FROM {LAKE}.steps AT (VERSION => $v) "
            "WHERE traj_id IN (SELECT traj_id FROM __curation_ids) ORDER BY traj_id, step_idx",
            {"v": snapshot_id},
        )
    finally:
        wh.con.unregister("__curation_ids")


def read_run_configs(wh: Warehouse, run_ids: Sequence[str], snapshot_id: int) -> dict[str, Any]:
    """run_id → its stored config (dict) at the snapshot."""
    if not run_ids:
        return {}
    df = wh.sql(
        f"SELECT run_id, config FROM {LAKE}.runs AT (VERSION => $v) "
        "WHERE run_id IN (SELECT unnest($ids))",
        {"v": snapshot_id, "ids": sorted(set(run_ids))},
    )
    out = {}
    for run_id, config in df.iter_rows():
        out[run_id] = json.loads(config) if isinstance(config, str) else config
    return out


_INFO_COLUMNS = (
    "traj_id",
    "run_id",
    "task_id",
    "policy",
    "status",
    "group_id",
    "n_steps",
    "suite",
    "site",
    "split",
    "instruction",
)


def trajectory_info(wh: Warehouse, traj_ids: Sequence[str], snapshot_id: int) -> pl.DataFrame:
    """traj_id, run_id, task_id, policy, status, group_id, n_steps, suite, site, split,
    instruction of ``traj_ids`` at ``snapshot_id``, with the task version each trajectory ran
    (the ``trajectory_tasks`` rule: :mod:`warehouse.relations`)."""
    if not traj_ids:
        return pl.DataFrame(
            schema={c: pl.Int64 if c == "n_steps" else pl.Utf8 for c in _INFO_COLUMNS}
        )
    query = f"""
        SELECT t.traj_id, t.run_id, t.task_id, t.policy, t.status, t.group_id, t.n_steps,
               k.suite, k.site, k.split, k.instruction
        FROM {LAKE}.trajectories AS t AT (VERSION => $v)
        JOIN trajectory_tasks k USING (traj_id)
        WHERE t.traj_id IN (SELECT unnest($ids))
        ORDER BY t.traj_id
        """
    return wh.sql(with_relations(query, at="$v"), {"v": snapshot_id, "ids": sorted(set(traj_ids))})


def scored_candidates(wh: Warehouse, traj_ids: Sequence[str], snapshot_id: int) -> pl.DataFrame:
    """The scored candidates of ``traj_ids``' steps at the snapshot: traj_id, step_idx,
    cand_idx, scorer, scorer_version, score, model_output, action_text (null scores left out),
    ordered by (traj_id, step_idx, scorer, scorer_version, cand_idx)."""
    _register_ids(wh, "__curation_ids", traj_ids)
    try:
        return wh.sql(
            f"""
            SELECT s.traj_id, s.step_idx, s.cand_idx, s.scorer, s.scorer_version, s.score,
                   c.model_output, c.action_text
            FROM {LAKE}.step_scores AS s AT (VERSION => $v)
            JOIN {LAKE}.candidates AS c AT (VERSION => $v)
              USING (traj_id, step_idx, cand_idx)
            WHERE s.traj_id IN (SELECT traj_id FROM __curation_ids) AND s.score IS NOT NULL
            ORDER BY s.traj_id, s.step_idx, s.scorer, s.scorer_version, s.cand_idx
            """,
            {"v": snapshot_id},
        )
    finally:
        wh.con.unregister("__curation_ids")


def steps_by_trajectory(steps: pl.DataFrame) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for row in steps.iter_rows(named=True):
        out.setdefault(row["traj_id"], []).append(row)
    return out
