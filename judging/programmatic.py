"""The ``programmatic`` judge: the bundled site's checker, as recorded at collection time.

The checker needs the site's final server state, which only exists while the episode's browser
session does; the collector grades then and stores the per-criterion results on the trajectory
(``meta.criteria``). This judge turns those into judgment rows, so programmatic verdicts sit
beside VLM verdicts and human labels in one table. Trajectories without a checker outcome
(live-web tasks, infrastructure errors) get no programmatic judgment.
"""

from __future__ import annotations

import json

import polars as pl

from warehouse.ids import make_id, stable_hash
from warehouse.records import Judgment
from warehouse.store import Warehouse

NAME, VERSION = "programmatic", "1"


def backlog(wh: Warehouse, run_id: str | None = None) -> pl.DataFrame:
    """Checked trajectories (success/failure) without a judgment from this judge version."""
    return wh.sql(
        "SELECT traj_id, status, meta FROM trajectories t WHERE status IN ('success', 'failure') "
        "AND ($run IS NULL OR run_id = $run) AND NOT EXISTS (SELECT 1 FROM judgments j "
        "WHERE j.traj_id = t.traj_id AND j.judge = $judge AND j.judge_version = $version)",
        {"run": run_id, "judge": NAME, "version": VERSION},
    )


def judge_rows(rows: pl.DataFrame) -> list[Judgment]:
    out = []
    for r in rows.iter_rows(named=True):
        meta = json.loads(r["meta"]) if r["meta"] else {}
        criteria = meta.get("criteria") or []
        passed = sum(1 for c in criteria if c.get("passed"))
        out.append(
            Judgment(
                judgment_id=make_id("judgment", r["traj_id"], NAME, VERSION),
                traj_id=r["traj_id"],
                judge=NAME,
                judge_version=VERSION,
                model=None,
                prompt_hash=stable_hash(NAME, VERSION, length=16),
                verdict=r["status"],
                score=passed / len(criteria) if criteria else float(r["status"] == "success"),
                criteria=criteria or None,
                rationale="; ".join(f"{c['name']}: {c.get('detail') or 'ok'}" for c in criteria)
                or None,
            )
        )
    return out


def run(wh: Warehouse, run_id: str | None = None) -> int:
    """Judge the backlog; returns the number of judgments written."""
    rows = judge_rows(backlog(wh, run_id))
    if rows:
        wh.write(rows)
    return len(rows)
