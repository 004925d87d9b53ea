"""The ``programmatic`` judge: the bundled site's checker, as recorded at collection time.

The checker needs the site's final server state, which only exists while the episode's browser
session does; the collector grades then and stores the per-criterion results on the trajectory
(``meta.criteria``). This judge turns those into judgments, so programmatic verdicts sit beside
VLM verdicts and human labels in one table. It reads server state and the answer's content, never
the page's words, so prompt injection cannot move it. Trajectories without a checker outcome
(live-web tasks, infrastructure errors) get no programmatic judgment.
"""

from __future__ import annotations

import asyncio

from judging.base import JudgeError, TrajectoryView, backlog, judge_all, make_judge
from judging.base import register as register_judge
from warehouse.ids import stable_hash
from warehouse.records import Criterion, Verdict
from warehouse.store import Warehouse

NAME, VERSION = "programmatic", "1"


@register_judge(NAME, needs=("checkers",), version=VERSION)
class ProgrammaticJudge:
    """Verdict = the checker's verdict; score = the share of criteria passed."""

    name, version, model = NAME, VERSION, None
    statuses = ("success", "failure")  # the statuses the collector's checker assigns
    needs_verdicts = False

    async def judge(self, traj: TrajectoryView) -> Verdict:
        if traj.status not in self.statuses:
            raise JudgeError(f"trajectory {traj.traj_id} was not checked (status {traj.status})")
        stored = traj.meta.get("criteria")
        criteria = [
            Criterion(str(c.get("name")), bool(c.get("passed")), c.get("detail"))
            for c in (stored if isinstance(stored, list) else [])
            if isinstance(c, dict)
        ]
        passed = sum(c.passed for c in criteria)
        rationale = "; ".join(f"{c.name}: {c.detail or 'ok'}" for c in criteria)
        return Verdict(
            verdict=traj.status,
            score=passed / len(criteria) if criteria else float(traj.status == "success"),
            criteria=criteria,
            rationale=rationale or None,
            prompt_hash=stable_hash(NAME, VERSION, length=16),
        )


def run(wh: Warehouse, run_id: str | None = None) -> int:
    """Judge the backlog; returns the number of judgments written."""
    judge = make_judge(NAME)
    ids = backlog(wh, judge, run_id)
    return asyncio.run(judge_all(wh, judge, ids)).judged if ids else 0
