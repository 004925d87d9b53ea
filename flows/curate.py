"""The ``curate`` flow: build a versioned dataset from a recipe (thin: the work is in
``curation.build.build_dataset``).

Re-running the same recipe over the same snapshot rebuilds the same dataset (same id, the same
bytes) in place; a failing quality gate registers nothing and leaves no export folder.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import flow, task

from curation.build import build_dataset
from curation.recipe import load_recipe
from flows import prefect_env
from flows.artifacts import artifact_key, publish
from stages.report import markdown_table
from stages.runs import code_version
from warehouse import Warehouse, WarehouseConfig


def default_out(home: str | None = None) -> Path:
    """``$WEBLOOP_HOME/datasets`` (the CLI's default export folder)."""
    return WarehouseConfig.from_env(home=home).home / "datasets"


def dataset_composition(wh: Warehouse, dataset_id: str) -> list[dict[str, Any]]:
    """Members of a dataset per site, split, policy and trajectory status: trajectories and
    steps (a step member counts its trajectory once)."""
    df = wh.sql(
        """
        SELECT k.site, k.split, t.policy, t.status,
               count(DISTINCT m.traj_id) AS trajectories,
               count(*) FILTER (WHERE m.step_idx IS NOT NULL) AS steps
        FROM dataset_members m
        JOIN trajectories t USING (traj_id)
        LEFT JOIN (SELECT DISTINCT task_id, site, split FROM tasks) k USING (task_id)
        WHERE m.dataset_id = $d
        GROUP BY ALL ORDER BY ALL
        """,
        {"d": dataset_id},
    )
    return df.to_dicts()


COMPOSITION_COLUMNS = ("site", "split", "policy", "status", "trajectories", "steps")


def composition_markdown(record: Any, composition: list[dict[str, Any]]) -> str:
    """The dataset's counts and its composition table as markdown."""
    counts = markdown_table([{"part": k, "rows": v} for k, v in (record.counts or {}).items()])
    return (
        f"# Dataset {record.name}\n\n`{record.dataset_id}` at warehouse snapshot "
        f"{record.snapshot_id}; export `{record.export_path}`\n\n## Counts\n\n{counts}\n\n"
        "## Composition (members by site, split, policy, outcome)\n\n"
        + markdown_table(composition, COMPOSITION_COLUMNS)
    )


@task(name="build-dataset")
def build(
    recipe_path: str, out_dir: str, snapshot: int | None, home: str | None = None
) -> dict[str, Any]:
    """Build, gate, export and register the dataset; its ``datasets`` row as a dict."""
    recipe = load_recipe(Path(recipe_path))
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        record = build_dataset(
            wh,
            recipe,
            out_dir=Path(out_dir),
            snapshot_id=snapshot,
            blobs=wh.blobs,
            progress=prefect_env.progress_of("curate"),
            code_version=code_version(),
        )
        composition = dataset_composition(wh, record.dataset_id)
    publish(
        artifact_key("dataset", record.name),
        composition_markdown(record, composition),
        f"dataset {record.name} ({record.dataset_id}): composition",
    )
    return {
        "dataset_id": record.dataset_id,
        "name": record.name,
        "snapshot_id": record.snapshot_id,
        "counts": record.counts,
        "export_path": record.export_path,
        "recipe_hash": record.recipe_hash,
    }


@flow(name="curate")
def curate_flow(
    recipe_path: str, out_dir: str, snapshot: int | None = None, home: str | None = None
) -> dict[str, Any]:
    """Build the dataset of a recipe file."""
    return build(recipe_path, out_dir, snapshot, home)


def curate(
    recipe_path: Path,
    out_dir: Path | None = None,
    snapshot: int | None = None,
    home: str | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the curate flow; ``on_progress`` gets one line per stage."""
    out = out_dir if out_dir is not None else default_out(home)
    with prefect_env.progress_to("curate", on_progress):
        return curate_flow(str(recipe_path), str(out), snapshot, home)
