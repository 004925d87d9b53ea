"""Build a versioned dataset from a recipe: the curation stage end to end.

Order (each stage prints one progress line with its time):

1. validate the recipe's warehouse names (``validate_against``), before any work;
2. pin the snapshot (given, or the current one) so maintenance never expires it;
3. select (``curation.select.select``) at that snapshot; nothing selected →
   :class:`CurationError` naming the filter that removed the last rows;
4. render examples (``curation.examples``) into a spool folder;
5. quality gates (``curation.gates``); a failure raises ``GateError`` with the GX data docs in
   ``<out_dir>/gx_docs/`` and registers nothing;
6. export (``curation.export``) into ``<out_dir>/<name>-<dataset_id>/`` (temp folder + rename);
7. one transaction writing the ``datasets`` row and its ``dataset_members`` (each selected
   trajectory with ``step_idx`` null, each kept step, each intervention's state).

``dataset_id = make_id("dataset", recipe_hash, snapshot_id)``: the same recipe over the same
snapshot is the same dataset, rebuilt byte-identical (re-running replaces it in place).
"""

from __future__ import annotations

import dataclasses
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from curation import export as export_mod
from curation import gates as gates_mod
from curation.examples import Examples, render_examples
from curation.recipe import Recipe, recipe_hash, validate_against
from curation.select import Selection, select
from warehouse.blobs import Blobs
from warehouse.connection import LAKE
from warehouse.ids import make_id
from warehouse.outdir import check_out_dir
from warehouse.records import Dataset, DatasetMember
from warehouse.store import Warehouse
from warehouse.versions import current_snapshot, latest_data_snapshot, pin


class CurationError(RuntimeError):
    """A build that cannot produce a dataset (nothing selected, an unknown snapshot)."""


def dataset_id_for(recipe: Recipe, snapshot_id: int) -> str:
    return make_id("dataset", recipe_hash(recipe), int(snapshot_id))


class _Stages:
    """Progress lines: ``curate <stage>: <what> (<seconds> s)``."""

    def __init__(self, progress: Callable[[str], Any] | None) -> None:
        self.progress = progress or (lambda _line: None)
        self.t = time.perf_counter()

    def done(self, stage: str, what: str) -> None:
        now = time.perf_counter()
        self.progress(f"curate {stage}: {what} ({now - self.t:.2f} s)")
        self.t = now


def build_dataset(
    wh: Warehouse,
    recipe: Recipe,
    *,
    out_dir: Path,
    snapshot_id: int | None = None,
    blobs: Blobs,
    progress: Callable[[str], Any] | None = print,
    code_version: str | None = None,
) -> Dataset:
    """Build, gate, export and register the dataset of ``recipe`` (see the module docstring);
    returns the registered :class:`~warehouse.records.Dataset` row."""
    st = _Stages(progress)
    validate_against(recipe, wh)
    st.done("validate", f"recipe {recipe.name!r} ok")
    sid = _pin(wh, recipe, snapshot_id)
    did = dataset_id_for(recipe, sid)
    st.done("pin", f"snapshot {sid} ({did})")
    sel = select(wh, recipe, snapshot_id=sid)
    if sel.trajectories.is_empty():
        raise CurationError(f"recipe {recipe.name!r} selected nothing: {empty_reason(sel)}")
    st.done(
        "select",
        f"{sel.trajectories.height} trajectories, {sel.steps.height} steps, "
        f"{sel.interventions.height} interventions",
    )
    out_dir = check_out_dir(out_dir)  # never a filesystem root nor through a linked OUT
    spool = out_dir / f".spool-{did}-{uuid.uuid4().hex[:8]}"
    try:
        ex = render_examples(wh, sel, recipe, blobs, spool)
        if not any(ex.counts.values()):
            asked = ", ".join(ex.counts) or "no output kinds"
            raise CurationError(
                f"recipe {recipe.name!r} produced no examples ({asked}) from "
                f"{sel.trajectories.height} trajectories: {empty_reason(sel)}"
            )
        st.done("examples", ", ".join(f"{k} {v}" for k, v in ex.counts.items()))
        results = _gate(wh, recipe, sel, ex, out_dir / "gx_docs")
        st.done("gates", f"{len(results)} passed")
        info = _export_info(wh, recipe, sel, ex, did, results)
        path = export_mod.export(ex, info, out_dir, progress=st.progress)
        st.done("export", str(path))
    finally:
        shutil.rmtree(spool, ignore_errors=True)
    record = Dataset(
        dataset_id=did,
        name=recipe.name,
        snapshot_id=sid,
        recipe=recipe.model_dump(mode="json"),
        counts={**ex.counts, "trajectories": sel.trajectories.height, "steps": sel.steps.height},
        export_path=str(path.resolve()),
        data_card=(path / "README.md").read_text(encoding="utf-8"),
        recipe_hash=recipe_hash(recipe),
        code_version=code_version,
    )
    members = member_rows(did, sel)
    wh.write_many([([record], Dataset), (members, DatasetMember)])
    st.done("register", f"{did}: {members.height} members")
    return record


def _pin(wh: Warehouse, recipe: Recipe, snapshot_id: int | None) -> int:
    latest = current_snapshot(wh)
    if snapshot_id is not None:
        known = wh.sql(
            f"SELECT count(*) AS n FROM {LAKE}.snapshots() WHERE snapshot_id = ?", [snapshot_id]
        ).item()
        if not known:
            raise CurationError(
                f"--snapshot {snapshot_id}: no such warehouse snapshot (latest is {latest})"
            )
    # by default the latest snapshot that changed data: registering a dataset is not new data,
    # so the same recipe built again over unchanged data is the same dataset
    sid = latest_data_snapshot(wh) if snapshot_id is None else int(snapshot_id)
    pin(wh, f"dataset {recipe.name}", sid)
    return sid


def empty_reason(sel: Selection) -> str:
    """Which stage removed the last rows: the last filter that removed any, or the sources."""
    for r in reversed(sel.report):
        if r.trajectories_removed or r.steps_removed:
            return (
                f"filter {r.name!r} removed the last rows ({r.trajectories_removed} "
                f"trajectories, {r.steps_removed} steps)"
            )
    return "the recipe's sources (suites/splits/runs/policies/dates) match no trajectories"


def _gate(
    wh: Warehouse, recipe: Recipe, sel: Selection, ex: Examples, docs: Path
) -> list[gates_mod.GateResult]:
    training = gates_mod.is_training(recipe)
    held = gates_mod.held_out_tasks(wh, sel.snapshot_id) if training else None
    keys = None
    if held is not None:
        ids = [*ex.tasks.get_column("task_id"), *held.get_column("task_id")]
        keys = gates_mod.task_keys(wh, ids, sel.snapshot_id)
    ids = sel.trajectories.get_column("traj_id")
    successes = gates_mod.recipe_successes(wh, recipe, ids, sel.snapshot_id)
    frames = gates_mod.gate_frames(ex, sel.trajectories, ex.tasks, held, keys, successes)
    return gates_mod.run_gates(frames, gates_mod.checks(recipe, training), docs)


def _export_info(
    wh: Warehouse,
    recipe: Recipe,
    sel: Selection,
    ex: Examples,
    did: str,
    results: list[gates_mod.GateResult],
) -> export_mod.ExportInfo:
    kept = sel.steps.group_by("traj_id").agg(pl.len().alias("steps"))
    composition = (
        sel.trajectories.join(kept, on="traj_id", how="left")
        .group_by("site", "split", "policy")
        .agg(pl.len().alias("trajectories"), pl.col("steps").fill_null(0).sum().alias("steps"))
        .sort("site", "split", "policy", nulls_last=True)
    )
    return export_mod.ExportInfo(
        dataset_id=did,
        name=recipe.name,
        description=recipe.description,
        snapshot_id=sel.snapshot_id,
        recipe=recipe.model_dump(mode="json"),
        recipe_hash=recipe_hash(recipe),
        report=[dataclasses.asdict(r) for r in sel.report],
        composition=composition,
        sources=suite_sources(wh, ex.tasks.get_column("task_id").to_list(), sel.snapshot_id),
        curriculum=sel.curriculum.sort("task_id").to_dicts(),
        horizon=list(sel.horizon),
        gates=[
            {"gate": r.gate, "checked": r.checked, "unexpected": r.unexpected, "ok": r.success}
            for r in sorted(results, key=lambda r: r.gate)
        ],
        rl_unrewarded=ex.rl_unrewarded,
    )


def suite_sources(wh: Warehouse, task_ids: list[str], snapshot_id: int) -> pl.DataFrame:
    """suite, source (``tasks.source``), tasks: where the dataset's tasks come from."""
    return wh.sql(
        f"SELECT suite, min(source) AS source, count(DISTINCT task_id) AS tasks "
        f"FROM {LAKE}.tasks AT (VERSION => $v) WHERE task_id IN (SELECT unnest($ids)) "
        "GROUP BY suite ORDER BY suite",
        {"v": snapshot_id, "ids": task_ids},
    )


def member_rows(dataset_id: str, sel: Selection) -> pl.DataFrame:
    """dataset_members: each trajectory (step_idx null), each kept step, each intervention's
    state (the failed trajectory at its first error), with the task split and weight."""
    t = sel.trajectories.select("traj_id", "split", pl.col("weight").cast(pl.Float64))
    whole = t.with_columns(pl.lit(None, pl.Int64).alias("step_idx"))
    steps = sel.steps.select("traj_id", pl.col("step_idx").cast(pl.Int64)).join(
        t, on="traj_id", how="left"
    )
    parts = [whole.select("traj_id", "step_idx", "split", "weight"), steps]
    iv = sel.interventions
    if iv is not None and iv.height:
        parts.append(
            iv.filter(pl.col("first_error_step").is_not_null()).select(
                "traj_id",
                pl.col("first_error_step").cast(pl.Int64).alias("step_idx"),
                pl.lit("intervention").alias("split"),
                pl.lit(1.0).alias("weight"),
            )
        )
    frames = [p.select("traj_id", "step_idx", "split", "weight") for p in parts]
    return (
        pl.concat(frames)
        .unique(["traj_id", "step_idx"], keep="first", maintain_order=True)
        .with_columns(pl.lit(dataset_id).alias("dataset_id"))
        .sort("traj_id", "step_idx", nulls_last=False)
    )
