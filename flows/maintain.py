"""The ``maintain_warehouse`` flow: :func:`stages.maintain.run_maintain` as a schedulable
Prefect flow; its report is a markdown artifact."""

from __future__ import annotations

from prefect import flow, task

from flows.artifacts import artifact_key, publish
from stages import maintain as stage
from stages.maintain import MaintainConfig
from warehouse import Warehouse, WarehouseConfig


@task(name="maintain")
def maintain_task(
    keep_recent_minutes: float = 60.0, home: str | None = None
) -> stage.MaintainResult:
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        res = stage.run_maintain(wh, MaintainConfig(keep_recent_minutes))
    publish(
        artifact_key("maintain-warehouse"),
        stage.report_markdown(res.report, keep_recent_minutes),
        "webloop warehouse maintenance report",
    )
    return res


@flow(name="maintain_warehouse")
def maintain_warehouse(
    keep_recent_minutes: float = 60.0, home: str | None = None
) -> stage.MaintainResult:
    """Compact the warehouse and expire unpinned snapshots older than ``keep_recent_minutes``."""
    return maintain_task(keep_recent_minutes, home)
