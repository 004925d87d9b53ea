"""RL group rows: one per trajectory with a known outcome.

``reward`` is 1 for ``success`` and 0 for ``failure`` (trajectories still ``finished``, i.e.
unjudged, get no row). ``advantage`` is the reward minus the mean reward of its ``group_id``
(the G samples of a task), divided by the group's population standard deviation when that is
above zero (GRPO); a group of one has advantage 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from curation.render import INVALID, StoredTrajectory, base_columns

REWARDS = {"success": 1.0, "failure": 0.0}


def group_advantages(rewards: Sequence[float]) -> list[float]:
    """``r - mean`` over the group, divided by the population std when it is above zero."""
    n = len(rewards)
    if n == 0:
        return []
    mean = sum(rewards) / n
    std = (sum((r - mean) ** 2 for r in rewards) / n) ** 0.5
    return [(r - mean) / std if std > 0 else r - mean for r in rewards]


def rl_rows(rendered: dict[str, StoredTrajectory]) -> list[dict[str, Any]]:
    """One row per rewarded trajectory; a group lies inside one chunk (groups are per task)."""
    groups: dict[str, list[StoredTrajectory]] = {}
    for tid, t in rendered.items():
        if t.info.get("status") in REWARDS:
            groups.setdefault(t.info.get("group_id") or tid, []).append(t)
    rows = []
    for gid in sorted(groups):
        members = sorted(groups[gid], key=lambda t: t.info["traj_id"])
        rewards = [REWARDS[t.info["status"]] for t in members]
        for t, r, a in zip(members, rewards, group_advantages(rewards), strict=True):
            rows.append(
                {
                    "group_id": gid,
                    "traj_id": t.info["traj_id"],
                    **base_columns(t),
                    "instruction": t.info["instruction"],
                    "status": t.info["status"],
                    "n_steps": len(t.steps),
                    "actions": [s["action_text"] or INVALID for s in t.steps],
                    "reward": r,
                    "advantage": a,
                    "weight": float(t.info.get("weight") or 1.0),
                }
            )
    return rows
