"""RL group rows: one per trajectory with a known outcome.

``reward`` is 1 for ``success`` and 0 for ``failure`` (trajectories still ``finished``, i.e.
unjudged, get no row). ``advantage`` is GRPO's group-relative advantage over the rewards of its
``group_id`` (the G samples of a task): ``(r - mean) / (std + 1e-6)`` with the population std
(:mod:`warehouse.advantage`, the one normalisation); a group of one, or of equal rewards, has
advantage 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from curation.render import INVALID, StoredTrajectory, base_columns
from warehouse.advantage import group_relative_values

REWARDS = {"success": 1.0, "failure": 0.0}


def group_advantages(rewards: Sequence[float]) -> list[float]:
    """GRPO's group-relative advantages of one group's rewards (:mod:`warehouse.advantage`)."""
    return [0.0 if a is None else a for a in group_relative_values(rewards)]


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
