"""The ``maintain_warehouse`` flow: ``webloop warehouse maintain`` as a schedulable flow.

Thin: the work is ``warehouse.versions.maintain`` (flush inlined data, merge small files, expire
snapshots that no dataset pins and that are older than ``keep_recent_minutes``, delete unused
files). The run is recorded in ``runs`` (kind ``maintain``, with the Prefect flow-run id in its
config) and its report is a markdown artifact.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from prefect import flow, task

from flows.artifacts import artifact_key, flow_run_id, publish
from stages.report import markdown_table
from stages.runs import recorded_run
from warehouse import Warehouse, WarehouseConfig
from warehouse.ids import run_id_for
from warehouse.versions import MaintenanceReport, maintain


def report_markdown(rep: MaintenanceReport, keep_recent_minutes: float) -> str:
    """The maintenance report as a markdown table."""
    rows = [
        {"what": "data files", "value": f"{rep.files_before} → {rep.files_after}"},
        {"what": "snapshots expired", "value": len(rep.snapshots_expired)},
        {"what": "pinned snapshots kept", "value": str(rep.snapshots_kept_pinned or "none")},
        {"what": "files deleted", "value": rep.files_deleted},
        {"what": "kept: snapshots younger than", "value": f"{keep_recent_minutes:g} min"},
    ]
    return "# Warehouse maintenance\n\n" + markdown_table(rows)


def run_maintain(wh: Warehouse, keep_recent_minutes: float = 60.0) -> dict[str, Any]:
    """Maintain ``wh`` and record the run; the report as a dict (plus ``run_id``)."""
    if keep_recent_minutes < 0:
        raise ValueError(f"keep_recent_minutes must be >= 0, got {keep_recent_minutes}")
    fr = flow_run_id()
    config = {"keep_recent_minutes": keep_recent_minutes, "flow_run_id": fr}
    started = dt.datetime.now(dt.UTC).isoformat()
    run_id = run_id_for("maintain", {**config, "started": started})
    with recorded_run(wh, run_id, "maintain", config):
        rep = maintain(wh, keep_recent=dt.timedelta(minutes=keep_recent_minutes))
    publish(
        artifact_key("maintain-warehouse"),
        report_markdown(rep, keep_recent_minutes),
        "webloop warehouse maintenance report",
    )
    return {"run_id": run_id, **dataclasses.asdict(rep)}


@task(name="maintain")
def maintain_task(keep_recent_minutes: float = 60.0, home: str | None = None) -> dict[str, Any]:
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        return run_maintain(wh, keep_recent_minutes)


@flow(name="maintain_warehouse")
def maintain_warehouse(
    keep_recent_minutes: float = 60.0, home: str | None = None
) -> dict[str, Any]:
    """Compact the warehouse and expire unpinned snapshots older than ``keep_recent_minutes``."""
    return maintain_task(keep_recent_minutes, home)
