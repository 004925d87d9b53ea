"""Helpers for judge tests: trajectories with real PNG screenshots stored in a warehouse."""

from __future__ import annotations

import io

from PIL import Image

from warehouse.records import Step, Task, Trajectory


def png(shade: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 40), (shade % 256, 80, 120)).save(buf, format="PNG")
    return buf.getvalue()


def store_trajectory(
    wh,
    traj_id: str,
    *,
    task_id: str = "t1",
    n_steps: int = 3,
    status: str = "finished",
    answer: str | None = "the answer",
    rubric: list[str] | None = None,
    site: str | None = "shop",
    run_id: str = "r1",
    final: bool = True,
    meta: dict | None = None,
    write_task: bool = True,
) -> None:
    """A task (with or without a rubric) and a trajectory of ``n_steps`` steps whose
    screenshots are distinct PNGs in the blob store (plus a final screenshot)."""
    if write_task:
        wh.write(
            [
                Task(
                    task_id=task_id,
                    suite="s",
                    site=site,
                    instruction=f"Do the thing for {task_id}",
                    start_url="https://example.com/",
                    rubric=rubric,
                )
            ]
        )
    steps = []
    for i in range(n_steps):
        shot = wh.blobs.put(png(i * 17 + len(traj_id))).hash
        steps.append(
            Step(
                traj_id=traj_id,
                step_idx=i,
                url=f"https://example.com/p{i // 2}",
                title=f"Page {i}",
                screenshot_hash=shot,
                action_text=f"click({100 + i}, 200)",
            )
        )
    meta = dict(meta or {})
    if final:
        meta.update(final_screenshot=wh.blobs.put(png(250)).hash, final_url="https://e.com/f")
    wh.write_trajectories(
        [
            Trajectory(
                traj_id=traj_id,
                run_id=run_id,
                task_id=task_id,
                policy="p",
                status=status,
                n_steps=n_steps,
                answer=answer,
                meta=meta or None,
            )
        ],
        steps,
    )
