"""SFT rows: one example per kept step, and one per verified intervention.

A step's example is the trajectory's prompt at that step and its target
(:meth:`~curation.render.StoredTrajectory.target`). Verified interventions
(``include.interventions``) add one example each: the failed trajectory's prefix up to
``first_error_step`` as the prompt, the corrective action (with the intervention's rationale as
the thought) as the target.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from curation.blob_reader import BlobReader
from curation.reads import read_run_configs, read_steps, steps_by_trajectory, trajectory_info
from curation.render import StoredTrajectory, base_columns, chat_messages, prompt_config, reply
from rollouts.actions import proposed_action_text
from warehouse.ids import make_id
from warehouse.store import Warehouse


def sft_rows(
    rendered: dict[str, StoredTrajectory],
    kept: dict[str, list[int]],
    rationales: dict[tuple[str, int], str],
) -> list[dict[str, Any]]:
    """One example per kept step of ``rendered`` (its rationale, when it has one, as the
    thought)."""
    rows = []
    for tid, t in rendered.items():
        for i in kept.get(tid, []):
            if i >= len(t.steps) or t.steps[i]["step_idx"] != i:
                continue  # not contiguous: the step-index gate reports it
            prompt, images, hashes = t.prompt(i)
            completion = t.target(i, rationales.get((tid, i)))
            rows.append(
                {
                    "example_id": make_id("sft", tid, i, "step"),
                    "kind": "step",
                    "traj_id": tid,
                    "step_idx": i,
                    **base_columns(t),
                    "prompt": prompt,
                    "completion": completion,
                    "images": images,
                    "image_hashes": hashes,
                    "prompt_hash": t.steps[i]["prompt_hash"],
                    "weight": float(t.info.get("weight") or 1.0),
                    "messages": chat_messages(prompt, completion),
                }
            )
    return rows


def intervention_rows(
    wh: Warehouse, interventions: pl.DataFrame, k_images: int, reader: BlobReader, v: int
) -> tuple[list[dict[str, Any]], pl.DataFrame]:
    """Prefix of the failed trajectory up to ``first_error_step`` + the corrective action."""
    iv = interventions.sort("intervention_id")
    ids = iv.get_column("traj_id").unique().to_list()
    frame = trajectory_info(wh, ids, v)
    info = {r["traj_id"]: r for r in frame.iter_rows(named=True)}
    configs = read_run_configs(wh, [r["run_id"] for r in info.values()], v)
    by_traj = steps_by_trajectory(read_steps(wh, ids, v))
    rows = []
    for r in iv.iter_rows(named=True):
        tid, at = r["traj_id"], r["first_error_step"]
        action = proposed_action_text(r["proposed_action"])
        steps = by_traj.get(tid, [])
        if tid not in info or at is None or action is None or not 0 <= at < len(steps):
            continue
        cfg = prompt_config(configs.get(info[tid]["run_id"]), k_images)
        t = StoredTrajectory(info[tid], steps, cfg, reader)
        prompt, images, hashes = t.prompt(int(at))
        completion = reply(action, r.get("rationale"))
        rows.append(
            {
                "example_id": make_id("sft", r["intervention_id"], "intervention"),
                "kind": "intervention",
                "traj_id": tid,
                "step_idx": int(at),
                **base_columns(t),
                "prompt": prompt,
                "completion": completion,
                "images": images,
                "image_hashes": hashes,
                "prompt_hash": steps[int(at)]["prompt_hash"],
                "weight": 1.0,
                "messages": chat_messages(prompt, completion),
            }
        )
    reader.clear()
    return rows, frame
