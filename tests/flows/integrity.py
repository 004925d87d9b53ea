"""Whole-warehouse checks shared by the collect, Dask and lease tests."""

from __future__ import annotations

from typing import Any


def duplicate_and_mismatched(wh: Any, run_id: str | None = None) -> tuple[int, int]:
    """``(trajectory rows beyond the first per traj_id, trajectories whose stored steps are not
    exactly ``n_steps`` distinct indices)``, over one run or every run. Both 0 on a whole run."""
    dup = wh.sql(
        "SELECT count(*) - count(DISTINCT traj_id) FROM trajectories "
        "WHERE $run IS NULL OR run_id = $run",
        {"run": run_id},
    ).item()
    mismatched = wh.sql(
        "SELECT count(*) FROM trajectories t LEFT JOIN (SELECT traj_id, count(*) AS n, "
        "count(DISTINCT step_idx) AS d FROM steps GROUP BY 1) s USING (traj_id) "
        "WHERE ($run IS NULL OR t.run_id = $run) "
        "AND (coalesce(s.n, 0) <> t.n_steps OR coalesce(s.d, 0) <> t.n_steps)",
        {"run": run_id},
    ).item()
    return dup, mismatched
