"""The ``intervene`` and ``rationales`` flows: :mod:`stages.intervene` as Prefect flows, the
intervene run's counts published as a markdown artifact."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect import flow, task

from curation.rationales import RationalesConfig
from flows import prefect_env
from flows.artifacts import artifact_key, publish
from stages import intervene as stage
from stages.intervene import InterveneConfig, InterveneResult
from warehouse import Warehouse, WarehouseConfig


@task(name="intervene-trajectories")
def intervene_trajectories(cfg: InterveneConfig, home: str | None = None) -> InterveneResult:
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        res = stage.run_intervene(wh, cfg, prefect_env.progress_of("intervene"))
    publish(
        artifact_key("interventions", cfg.teacher_name),
        stage.intervene_markdown(res),
        f"intervene run {res.run_id}",
    )
    return res


@flow(name="intervene")
def intervene_flow(cfg: InterveneConfig, home: str | None = None) -> InterveneResult:
    """First errors of failed trajectories, teacher corrections, verification by replay."""
    return intervene_trajectories(cfg, home)


def intervene(
    cfg: InterveneConfig,
    home: str | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
) -> InterveneResult:
    with prefect_env.progress_to("intervene", on_progress):
        return intervene_flow(cfg, home)


@task(name="write-rationales")
def write_rationales(cfg: RationalesConfig, home: str | None = None) -> dict[str, Any]:
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        return stage.run_rationales(wh, cfg, prefect_env.progress_of("rationales"))


@flow(name="rationales")
def rationales_flow(cfg: RationalesConfig, home: str | None = None) -> dict[str, Any]:
    """Teacher thoughts for the steps of successful expert trajectories (ERA)."""
    return write_rationales(cfg, home)


def rationales(
    cfg: RationalesConfig,
    home: str | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    with prefect_env.progress_to("rationales", on_progress):
        return rationales_flow(cfg, home)
