"""The ``maintain`` stage: ``webloop warehouse maintain`` (``flows.maintain`` schedules it).

The work is ``warehouse.versions.maintain``: flush inlined data, merge small files, expire
snapshots that no dataset pins and that are older than ``keep_recent_minutes``, delete unused
files. The run is recorded in ``runs`` (kind ``maintain``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass

from stages import runs
from stages.config import check_config, setting
from stages.report import markdown_table
from stages.runs import recorded_run
from warehouse import Warehouse
from warehouse.ids import run_id_for
from warehouse.versions import MaintenanceReport, maintain


@dataclass(frozen=True)
class MaintainConfig:
    """How much recent history maintenance keeps."""

    keep_recent_minutes: float = setting(
        60.0,
        help="Keep snapshots younger than this (minutes; pinned snapshots are always kept).",
        min=0.0,
        max=525_600.0,
    )


@dataclass(frozen=True)
class MaintainResult:
    """A maintenance run: its id and what it did."""

    run_id: str
    report: MaintenanceReport


def run_maintain(wh: Warehouse, cfg: MaintainConfig) -> MaintainResult:
    """Maintain ``wh`` and record the run."""
    check_config(cfg)
    config = {"keep_recent_minutes": cfg.keep_recent_minutes}
    started = dt.datetime.now(dt.UTC).isoformat()
    run_id = run_id_for(
        "maintain", {**config, "flow_run_id": runs.orchestrator_run(), "started": started}
    )
    with recorded_run(wh, run_id, "maintain", config):
        rep = maintain(wh, keep_recent=dt.timedelta(minutes=cfg.keep_recent_minutes))
    return MaintainResult(run_id=run_id, report=rep)


def report_markdown(rep: MaintenanceReport, keep_recent_minutes: float) -> str:
    """The maintenance report as a markdown table."""
    r = dataclasses.asdict(rep)
    rows = [
        {"what": "data files", "value": f"{r['files_before']} → {r['files_after']}"},
        {"what": "snapshots expired", "value": len(r["snapshots_expired"])},
        {"what": "pinned snapshots kept", "value": str(r["snapshots_kept_pinned"] or "none")},
        {"what": "files deleted", "value": r["files_deleted"]},
        {"what": "kept: snapshots younger than", "value": f"{keep_recent_minutes:g} min"},
    ]
    return "# Warehouse maintenance\n\n" + markdown_table(rows)
