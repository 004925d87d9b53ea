"""Training examples from a :class:`~curation.select.Selection`: SFT chat examples, RL groups
and preference pairs, rendered by the rollout prompt builder.

:func:`render_examples` is the driver; the seams are modules of their own:

* :mod:`curation.schemas`: the Arrow schemas of the three kinds (:data:`KINDS`);
* :mod:`curation.reads`: steps, run configs, task details and scored candidates at the snapshot;
* :mod:`curation.blob_reader`: screenshots and trees from the blob store, checked once each;
* :mod:`curation.render`: a stored trajectory's prompt and target at any step, byte-identical to
  what the policy saw (with the run's own ``k_images``), and :func:`sft_messages` (row → chat);
* :mod:`curation.sft_rows`: one SFT example per kept step, one per verified intervention;
* :mod:`curation.rl_rows`: one RL row per trajectory with an outcome, group-relative advantages;
* :mod:`curation.preference_rows`: ``outcome`` and ``prm`` preference pairs;
* :mod:`curation.example_checks`: the frames the quality gates read.

The stored action forms (``steps.action``, ``interventions.proposed_action``) are read back by
:func:`rollouts.actions.action_from_dict` and :func:`rollouts.actions.proposed_action_text`.
Every name callers import from here stays importable from here.

Work is columnar and streamed: trajectories are processed in chunks of whole tasks, steps are
read per chunk with one query at the pinned snapshot, rows go to Arrow IPC spool files chunk by
chunk (never the whole dataset in memory); blobs are read once per chunk.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from curation.blob_reader import BlobReader
from curation.example_checks import step_checks, step_index, target_check
from curation.preference_rows import outcome_pairs, prm_pairs
from curation.reads import (
    read_run_configs,
    read_steps,
    scored_candidates,
    steps_by_trajectory,
    trajectory_info,
)
from curation.render import (
    INVALID,
    StoredTrajectory,
    expert_policy,
    prompt_config,
    reply,
    sft_messages,
    summaries,
)
from curation.rl_rows import REWARDS, group_advantages, rl_rows
from curation.schemas import KINDS, PREF_SCHEMA, RL_SCHEMA, SCHEMAS, SFT_SCHEMA
from curation.sft_rows import intervention_rows, sft_rows
from rollouts.actions import action_from_dict, proposed_action_text
from warehouse.blobs import Blobs
from warehouse.store import Warehouse

__all__ = [
    "CHUNK_TRAJECTORIES",
    "INVALID",
    "KINDS",
    "PREF_SCHEMA",
    "REWARDS",
    "RL_SCHEMA",
    "SCHEMAS",
    "SFT_SCHEMA",
    "BlobReader",
    "Examples",
    "action_from_dict",
    "expert_policy",
    "group_advantages",
    "prompt_config",
    "proposed_action_text",
    "read_run_configs",
    "read_steps",
    "render_examples",
    "reply",
    "sft_messages",
    "summaries",
    "trajectory_info",
]

CHUNK_TRAJECTORIES = 512  # trajectories per chunk (whole tasks: a task never spans chunks)


@dataclass
class Examples:
    """Rendered examples, spooled to Arrow IPC stream files (one per kind that was asked for),
    and the small check frames the quality gates read.

    ``blob_checks``: hash, role (screenshot | a11y), exists, reason (null: a usable blob).
    ``target_checks``: example_id, kind, completion, parses (the target parses in the grammar).
    ``step_index``: traj_id, n_steps (stored), count, min_idx, max_idx, contiguous.
    ``step_checks``: traj_id, step_idx, action_text, parses (each kept step's recorded action).
    ``tasks``: task_id, split, instruction of every task the examples come from.
    ``counts``: rows per kind; ``rl_unrewarded``: trajectories without an outcome (no RL row).
    """

    spool: dict[str, Path] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    blob_checks: pl.DataFrame | None = None
    target_checks: pl.DataFrame | None = None
    step_index: pl.DataFrame | None = None
    step_checks: pl.DataFrame | None = None
    tasks: pl.DataFrame | None = None
    rl_unrewarded: int = 0


class _Spool:
    """Arrow IPC stream files, one per kind, written batch by batch."""

    def __init__(self, folder: Path, kinds: Sequence[str]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.paths = {k: folder / f"{k}.arrow" for k in kinds}
        self.writers = {
            k: pa.ipc.new_stream(pa.OSFile(str(p), "wb"), SCHEMAS[k]) for k, p in self.paths.items()
        }
        self.counts = dict.fromkeys(kinds, 0)

    def write(self, kind: str, rows: list[dict[str, Any]]) -> None:
        if rows and kind in self.writers:
            self.writers[kind].write_batch(pa.RecordBatch.from_pylist(rows, schema=SCHEMAS[kind]))
            self.counts[kind] += len(rows)

    def close(self) -> None:
        for w in self.writers.values():
            w.close()


def render_examples(
    wh: Warehouse,
    sel: Any,
    recipe: Any,
    blobs: Blobs,
    spool_dir: Path,
    *,
    chunk: int = CHUNK_TRAJECTORIES,
) -> Examples:
    """Render the examples ``recipe.output`` asks for from ``sel`` into ``spool_dir``."""
    out_cfg = recipe.output
    kinds = [k for k, on in zip(KINDS, _wanted(recipe), strict=True) if on]
    spool = _Spool(spool_dir, kinds)
    reader = BlobReader(blobs)
    v = int(sel.snapshot_id)
    trajs = sel.trajectories.sort("task_id", "traj_id")
    kept = _kept(sel.steps)
    rationales = _rationale_map(sel)
    configs = read_run_configs(wh, trajs.get_column("run_id").unique().to_list(), v)
    checks: list[dict[str, Any]] = []
    index_frames: list[pl.DataFrame] = []
    step_frames: list[pl.DataFrame] = []
    tasks = [trajs.select("task_id", "split", "instruction")]
    unrewarded = 0
    try:
        for part in _task_chunks(trajs, chunk):
            ids = part.get_column("traj_id").to_list()
            steps = read_steps(wh, ids, v)
            index_frames.append(step_index(part, steps))
            step_frames.append(step_checks(steps, sel.steps))
            by_traj = steps_by_trajectory(steps)
            rendered = {
                row["traj_id"]: StoredTrajectory(
                    row,
                    by_traj.get(row["traj_id"], []),
                    prompt_config(configs.get(row["run_id"]), out_cfg.k_images),
                    reader,
                )
                for row in part.iter_rows(named=True)
            }
            if "sft" in kinds:
                rows = sft_rows(rendered, kept, rationales)
                checks += [target_check(r) for r in rows]
                spool.write("sft", rows)
            if "rl" in kinds:
                rows = rl_rows(rendered)
                unrewarded += len(rendered) - len(rows)
                spool.write("rl", rows)
            if "preferences" in kinds:
                rows = outcome_pairs(rendered, kept, rationales)
                rows += prm_pairs(scored_candidates(wh, list(rendered), v), rendered, kept)
                spool.write("preferences", rows)
            reader.clear()
        if "sft" in kinds and sel.interventions is not None and sel.interventions.height:
            rows, info = intervention_rows(wh, sel.interventions, out_cfg.k_images, reader, v)
            tasks.append(info.select("task_id", "split", "instruction"))
            checks += [target_check(r) for r in rows]
            spool.write("sft", rows)
    finally:
        spool.close()
    return Examples(
        spool=spool.paths,
        counts=spool.counts,
        blob_checks=reader.frame(),
        target_checks=pl.DataFrame(
            checks,
            schema={
                "example_id": pl.Utf8,
                "kind": pl.Utf8,
                "completion": pl.Utf8,
                "parses": pl.Boolean,
            },
        ),
        step_index=pl.concat(index_frames) if index_frames else step_index(trajs.head(0), None),
        step_checks=pl.concat(step_frames) if step_frames else step_checks(None, sel.steps),
        tasks=pl.concat(tasks).unique("task_id", keep="first").sort("task_id"),
        rl_unrewarded=unrewarded,
    )


def _wanted(recipe: Any) -> tuple[bool, bool, bool]:
    o = recipe.output
    return bool(o.sft), bool(o.rl_groups), bool(o.preferences)


def _kept(steps: pl.DataFrame) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for tid, idx in steps.select("traj_id", "step_idx").sort("traj_id", "step_idx").iter_rows():
        out.setdefault(tid, []).append(int(idx))
    return out


def _rationale_map(sel: Any) -> dict[tuple[str, int], str]:
    r = getattr(sel, "rationales", None)
    if r is None or r.is_empty():
        return {}
    return {(t, int(i)): th for t, i, th in r.select("traj_id", "step_idx", "thought").iter_rows()}


def _task_chunks(trajs: pl.DataFrame, size: int) -> Iterator[pl.DataFrame]:
    """Consecutive slices of ``trajs`` (sorted by task) of about ``size`` trajectories that
    never split a task."""
    if trajs.is_empty():
        return
    tasks = trajs.get_column("task_id").to_list()
    start = 0
    while start < len(tasks):
        end = min(start + size, len(tasks))
        while end < len(tasks) and tasks[end] == tasks[end - 1]:
            end += 1
        yield trajs.slice(start, end - start)
        start = end
