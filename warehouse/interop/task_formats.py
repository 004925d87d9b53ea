"""External task formats → warehouse tasks.

- Online-Mind2Web tasks: JSON array or JSONL of ``{task_id, confirmed_task, website,
  reference_length, level}``.
- WebVoyager: JSONL of ``{web_name, id, ques, web}``.
- Rubric tasks: JSON array or JSONL of ``{instruction, start_url, rubric: [..], reference?,
  task_id?, site?, split?}``.

Malformed rows are reported with their line (or entry) number and the reason; the rest imports.
Storing goes through :func:`warehouse.tasks.put_tasks`, so a changed task becomes a new version.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from warehouse.connection import WarehouseError
from warehouse.ids import stable_hash
from warehouse.records import Task


class RowError(ValueError):
    """One row cannot become a task; the message says why."""


@dataclass
class ParsedTasks:
    tasks: list[Task] = field(default_factory=list)
    errors: list[tuple[int, str]] = field(default_factory=list)  # (line or entry, reason)


def read_rows(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON or the JSONDecodeError) for a JSON array or a JSONL file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WarehouseError(f"{path}: cannot read ({exc})") from None
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise WarehouseError(f"{path}: not valid JSON ({exc})") from None
        yield from enumerate(data, start=1)
        return
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as exc:
            yield n, exc


def _str(row: dict[str, Any], key: str) -> str:
    v = row.get(key)
    if not isinstance(v, str) or not v.strip():
        raise RowError(f"'{key}' is missing or not a non-empty string")
    return v.strip()


def _url(row: dict[str, Any], key: str) -> str:
    v = _str(row, key)
    parts = urlsplit(v)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RowError(f"'{key}' is not an http(s) URL: {v!r}")
    return v


def _om2w(row: dict[str, Any]) -> Task:
    website = _url(row, "website")
    ref_len = row.get("reference_length")
    if ref_len is not None and (not isinstance(ref_len, int) or isinstance(ref_len, bool)):
        raise RowError("'reference_length' must be an integer")
    return Task(
        task_id=_str(row, "task_id"),
        suite="om2w",
        site=urlsplit(website).hostname,
        instruction=_str(row, "confirmed_task"),
        start_url=website,
        split="test",
        difficulty=ref_len,
        source="online-mind2web",
        meta={"level": row.get("level")} if row.get("level") else None,
    )


def _webvoyager(row: dict[str, Any]) -> Task:
    tid = row.get("id")
    if not isinstance(tid, str | int) or str(tid).strip() == "":
        raise RowError("'id' is missing")
    return Task(
        task_id=f"webvoyager/{tid}",
        suite="webvoyager",
        site=_str(row, "web_name"),
        instruction=_str(row, "ques"),
        start_url=_url(row, "web"),
        split="test",
        source="webvoyager",
    )


def _rubric(row: dict[str, Any]) -> Task:
    instruction, start = _str(row, "instruction"), _url(row, "start_url")
    rubric = row.get("rubric")
    if (
        not isinstance(rubric, list)
        or not rubric
        or not all(isinstance(r, str) and r.strip() for r in rubric)
    ):
        raise RowError("'rubric' must be a non-empty list of strings")
    tid = row.get("task_id") or f"rubric/{stable_hash(instruction, start, length=12)}"
    return Task(
        task_id=str(tid),
        suite=str(row.get("suite") or "rubric"),
        site=row.get("site") or urlsplit(start).hostname,
        instruction=instruction,
        start_url=start,
        rubric=rubric,
        reference=row.get("reference"),
        split=row.get("split") or "test",
        source="rubric-file",
    )


FORMATS: dict[str, Callable[[dict[str, Any]], Task]] = {
    "om2w": _om2w,
    "webvoyager": _webvoyager,
    "rubric": _rubric,
}


def parse_task_file(fmt: str, path: str | Path) -> ParsedTasks:
    """Parse a task file of format ``fmt`` (om2w, webvoyager, rubric)."""
    if fmt not in FORMATS:
        raise WarehouseError(f"unknown task format {fmt!r}; known: {sorted(FORMATS)}")
    out = ParsedTasks()
    seen: set[str] = set()
    for n, row in read_rows(path):
        if isinstance(row, json.JSONDecodeError):
            out.errors.append((n, f"not valid JSON ({row.msg})"))
            continue
        if not isinstance(row, dict):
            out.errors.append((n, "not a JSON object"))
            continue
        try:
            task = FORMATS[fmt](row)
        except RowError as exc:
            out.errors.append((n, str(exc)))
            continue
        if task.task_id in seen:
            out.errors.append((n, f"duplicate task id {task.task_id!r} in this file"))
            continue
        seen.add(task.task_id)
        out.tasks.append(task)
    return out
