"""Versioned task writes: a changed task gets a new version, never a silent overwrite."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import polars as pl

from warehouse.connection import LAKE
from warehouse.ids import stable_hash
from warehouse.records import Task
from warehouse.relations import with_relations
from warehouse.store import Warehouse

_CONTENT = (
    "suite",
    "site",
    "instruction",
    "start_url",
    "split",
    "difficulty",
    "rubric",
    "reference",
    "checker",
    "suite_version",
)


def task_content_hash(task: Task) -> str:
    """Hash of what defines a task (not its id, version, metadata or timestamps)."""
    return stable_hash(*(getattr(task, f) for f in _CONTENT), length=32)


@dataclass
class TaskWriteReport:
    """Task ids by outcome of :func:`put_tasks`."""

    new: list[str] = field(default_factory=list)
    new_version: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    stored: list[Task] = field(default_factory=list)


def put_tasks(wh: Warehouse, tasks: Sequence[Task]) -> TaskWriteReport:
    """Store tasks: unknown ids as version 1, changed ones as latest+1, identical ones skipped."""
    rep = TaskWriteReport()
    if not tasks:
        return rep
    ids = sorted({t.task_id for t in tasks})
    latest = wh.sql(
        f"SELECT task_id, max_by(content_hash, version) AS h, max(version) AS v "
        f"FROM {LAKE}.tasks WHERE task_id IN (SELECT unnest($ids)) GROUP BY task_id",
        {"ids": ids},
    )
    known = {r["task_id"]: (r["h"], r["v"]) for r in latest.iter_rows(named=True)}
    to_write = []
    for task in tasks:
        h = task_content_hash(task)
        prev = known.get(task.task_id)
        if prev is None:
            rep.new.append(task.task_id)
            version = 1
        elif prev[0] == h:
            rep.unchanged.append(task.task_id)
            rep.stored.append(dataclasses.replace(task, version=prev[1], content_hash=h))
            continue
        else:
            rep.new_version.append(task.task_id)
            version = prev[1] + 1
        known[task.task_id] = (h, version)
        stored = dataclasses.replace(task, version=version, content_hash=h)
        to_write.append(stored)
        rep.stored.append(stored)
    if to_write:
        wh.write(to_write, Task)
    return rep


def latest_tasks(
    wh: Warehouse, where: str | None = None, params: dict | None = None
) -> pl.DataFrame:
    """The latest version of each task (optionally filtered)."""
    q = "SELECT * FROM latest_tasks" + (f" WHERE {where}" if where else "")
    return wh.sql(with_relations(q), params)
