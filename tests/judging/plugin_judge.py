"""A user's own judge, in its own module (what docs/how-to/add-a-judge.md shows): imported
through ``WEBLOOP_PLUGINS``, it is known to the CLI and the judge stage by name."""

from __future__ import annotations

import re

from judging.base import JUDGED_STATUSES, TrajectoryView, register
from warehouse.records import Verdict

GAVE_UP = re.compile(r"\b(cannot|can't|unable to|not possible|could not)\b", re.I)


@register("answer_given")
class AnswerGivenJudge:
    """Success when the agent ended with a final answer that does not give up."""

    name, version, model = "answer_given", "1", None
    statuses = JUDGED_STATUSES  # the trajectory statuses it takes
    needs_verdicts = False  # it does not read other judges' verdicts

    async def judge(self, traj: TrajectoryView) -> Verdict:
        answer = (traj.answer or "").strip()
        gave_up = bool(GAVE_UP.search(answer))
        ok = bool(answer) and not gave_up
        why = "answered" if ok else ("gave up" if gave_up else "no final answer")
        return Verdict(verdict="success" if ok else "failure", score=float(ok), rationale=why)
