"""The ``ensemble`` judge: combines other judges' stored verdicts; abstains when they disagree.

Rules over the members' latest non-error verdicts (a member's abstention counts as no vote):

* ``unanimous``: every member agrees, else abstain.
* ``majority``: more than half of the members say the same, else abstain (ties abstain).
* ``threshold``: success when at least ``threshold`` of the votes say success, failure when at
  most ``1 - threshold`` do, else abstain.

A member without a verdict yet is a judge error (retried by the next run), not a missing vote:
run the members first, then the ensemble.
"""

from __future__ import annotations

from judging.base import JUDGED_STATUSES, JudgeError, TrajectoryView
from judging.base import register as register_judge
from warehouse.ids import stable_hash
from warehouse.records import Criterion, Verdict

NAME, BASE_VERSION = "ensemble", "1"
RULES = ("unanimous", "majority", "threshold")


def combine(votes: list[bool], rule: str, threshold: float = 0.5) -> str:
    """success / failure / abstain from member votes (True = success)."""
    if not votes:
        return "abstain"
    share = sum(votes) / len(votes)
    if rule == "unanimous":
        return "success" if share == 1 else "failure" if share == 0 else "abstain"
    if rule == "majority":
        return "success" if share > 0.5 else "failure" if share < 0.5 else "abstain"
    if rule == "threshold":
        return (
            "success"
            if share >= threshold
            else "failure"
            if share <= 1 - threshold
            else ("abstain")
        )
    raise ValueError(f"unknown ensemble rule {rule!r}; known: {RULES}")


@register_judge(NAME, needs=("members",), options=("members", "rule", "threshold"))
class EnsembleJudge:
    """Majority / unanimity / threshold over the stored verdicts of ``members``."""

    name = NAME
    model = None
    statuses = JUDGED_STATUSES
    needs_verdicts = True

    def __init__(
        self, members: list[str] | str, rule: str = "majority", threshold: float = 0.5
    ) -> None:
        """An ensemble of stored verdicts.

        :param members: the member judges (two or more; a list or comma-separated).
        :param rule: unanimous, majority or threshold.
        :param threshold: rule threshold: the share of success votes for a success (and of
            failure votes for a failure), in [0.5, 1].
        """
        names = [m.strip() for m in members.split(",")] if isinstance(members, str) else members
        names = [m for m in names if m]
        if len(names) < 2:
            raise ValueError("an ensemble needs at least two member judges")
        if rule not in RULES:
            raise ValueError(f"unknown ensemble rule {rule!r}; known: {RULES}")
        if not 0.5 <= threshold <= 1.0:
            raise ValueError("threshold is in [0.5, 1]")
        self.members, self.rule, self.threshold = sorted(set(names)), rule, threshold
        spec = f"{rule}:{threshold}" if rule == "threshold" else rule
        self.version = f"{BASE_VERSION}/{spec}/{'+'.join(self.members)}"

    async def judge(self, traj: TrajectoryView) -> Verdict:
        missing = [m for m in self.members if m not in traj.verdicts]
        if missing:
            raise JudgeError(f"no verdict yet from member judge(s) {missing}; run them first")
        votes = {m: traj.verdicts[m] for m in self.members}
        counted = [v == "success" for v in votes.values() if v in ("success", "failure")]
        verdict = combine(counted, self.rule, self.threshold)
        return Verdict(
            verdict=verdict,
            score=sum(counted) / len(counted) if counted else None,
            criteria=[Criterion(m, v == "success", v) for m, v in votes.items()],
            rationale=", ".join(f"{m}: {v}" for m, v in votes.items()) + f" → {verdict}",
            prompt_hash=stable_hash(NAME, self.version, length=16),
        )
