"""The ``curate`` flow: :func:`stages.curate.run_curate` as a Prefect flow; the dataset's
composition is published as a markdown artifact."""

from __future__ import annotations

from collections.abc import Callable

from prefect import flow, task

from flows import prefect_env
from flows.artifacts import artifact_key, publish
from stages import curate as stage
from stages.curate import CurateConfig, CurateResult
from warehouse import Warehouse, WarehouseConfig


@task(name="build-dataset")
def build(cfg: CurateConfig, home: str | None = None) -> CurateResult:
    """Build, gate, export and register the dataset."""
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        res = stage.run_curate(wh, cfg, prefect_env.progress_of("curate"))
    publish(
        artifact_key("dataset", res.name),
        stage.composition_markdown(res),
        f"dataset {res.name} ({res.dataset_id}): composition",
    )
    return res


@flow(name="curate")
def curate_flow(cfg: CurateConfig, home: str | None = None) -> CurateResult:
    """Build the dataset of a recipe file."""
    return build(cfg, home)


def curate(
    cfg: CurateConfig, home: str | None = None, on_progress: Callable[[str], None] | None = None
) -> CurateResult:
    """Run the curate flow; ``on_progress`` gets one line per stage."""
    with prefect_env.progress_to("curate", on_progress):
        return curate_flow(cfg, home)
