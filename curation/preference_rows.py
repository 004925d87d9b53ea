"""Preference pairs, from two sources.

* ``outcome`` (:func:`outcome_pairs`): for each failed trajectory, the successful trajectory of
  the same task sharing the longest prefix of actions (ties: smallest traj_id); at the first step
  where they differ (the "same state": same task, same earlier actions) the success's reply is
  ``chosen``, the failure's ``rejected``; the prompt is the successful trajectory's.
* ``prm`` (:func:`prm_pairs`): at a kept step with scored candidates (``step_scores`` +
  ``candidates``, :func:`curation.reads.scored_candidates`), per scorer version, the
  highest-scored candidate is ``chosen`` and the lowest ``rejected`` (ties: lowest cand_idx),
  when their scores differ.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from curation.render import StoredTrajectory, reply
from warehouse.ids import make_id


def _common_prefix(a: list[str | None], b: list[str | None]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def outcome_pairs(
    rendered: dict[str, StoredTrajectory],
    kept: dict[str, list[int]],
    rationales: dict[tuple[str, int], str],
) -> list[dict[str, Any]]:
    """``outcome`` pairs of ``rendered`` (failures against the nearest success of their task)."""
    by_task: dict[str, list[StoredTrajectory]] = {}
    for t in rendered.values():
        by_task.setdefault(t.info["task_id"], []).append(t)
    rows = []
    for task_id in sorted(by_task):
        ts = sorted(by_task[task_id], key=lambda t: t.info["traj_id"])
        wins = [t for t in ts if t.info.get("status") == "success" and t.steps]
        for f in (t for t in ts if t.info.get("status") == "failure" and t.steps):
            acts_f = [s["action_text"] for s in f.steps]
            best, at = None, -1
            for s in wins:
                n = _common_prefix([x["action_text"] for x in s.steps], acts_f)
                if n > at and n < len(s.steps) and n < len(f.steps):
                    best, at = s, n
            if best is None or at not in kept.get(best.info["traj_id"], []):
                continue
            sid = best.info["traj_id"]
            chosen = best.target(at, rationales.get((sid, at)))
            rejected = f.target(at, rationales.get((f.info["traj_id"], at)))
            if chosen == rejected:
                continue
            prompt, images, hashes = best.prompt(at)
            rows.append(
                {
                    "pair_id": make_id("pref", "outcome", sid, f.info["traj_id"], at),
                    "source": "outcome",
                    "task_id": task_id,
                    "site": best.info.get("site"),
                    "split": best.info.get("split"),
                    "traj_id": sid,
                    "step_idx": at,
                    "prompt": prompt,
                    "images": images,
                    "image_hashes": hashes,
                    "chosen": chosen,
                    "rejected": rejected,
                    "chosen_ref": sid,
                    "rejected_ref": f.info["traj_id"],
                    "scorer": None,
                    "chosen_score": None,
                    "rejected_score": None,
                }
            )
    return rows


def prm_pairs(
    scored: pl.DataFrame, rendered: dict[str, StoredTrajectory], kept: dict[str, list[int]]
) -> list[dict[str, Any]]:
    """Pairs from ``scored`` (:func:`curation.reads.scored_candidates` of ``rendered``)."""
    rows = []
    for (tid, idx, scorer, version), g in scored.group_by(
        "traj_id", "step_idx", "scorer", "scorer_version", maintain_order=True
    ):
        idx = int(idx)
        if idx not in kept.get(tid, []) or g.height < 2:
            continue
        best = g.sort(["score", "cand_idx"], descending=[True, False]).row(0, named=True)
        worst = g.sort(["score", "cand_idx"], descending=[False, False]).row(0, named=True)
        if best["score"] <= worst["score"]:
            continue
        t = rendered[tid]
        prompt, images, hashes = t.prompt(idx)
        rows.append(
            {
                "pair_id": make_id("pref", "prm", tid, idx, scorer, version),
                "source": "prm",
                "task_id": t.info["task_id"],
                "site": t.info.get("site"),
                "split": t.info.get("split"),
                "traj_id": tid,
                "step_idx": idx,
                "prompt": prompt,
                "images": images,
                "image_hashes": hashes,
                "chosen": _candidate_text(best),
                "rejected": _candidate_text(worst),
                "chosen_ref": f"{tid}/{idx}/{best['cand_idx']}",
                "rejected_ref": f"{tid}/{idx}/{worst['cand_idx']}",
                "scorer": f"{scorer}@{version}",
                "chosen_score": float(best["score"]),
                "rejected_score": float(worst["score"]),
            }
        )
    return rows


def _candidate_text(row: dict[str, Any]) -> str:
    if row.get("model_output"):
        return row["model_output"]
    return reply(row["action_text"] or "")
