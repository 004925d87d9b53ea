"""The ``runs`` row of a stage run: its full configuration and code version, written as
``running`` when it starts and ``completed`` or ``failed`` (with the error) when it ends."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from warehouse.records import Run, utcnow
from warehouse.store import Warehouse


def code_version() -> str:
    """The git commit of the code (``unknown`` outside a checkout)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).parent,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@contextmanager
def recorded_run(
    wh: Warehouse, run_id: str, kind: str, config: dict[str, Any], name: str | None = None
) -> Iterator[None]:
    """Record the run around the ``with`` body; its start time survives the final update. Inside a
    Prefect flow run, the config also names it (``flow_run_id``: the run's page in the UI)."""
    from flows.artifacts import flow_run_id

    prefect_id = flow_run_id()
    if prefect_id is not None:
        config = {**config, "flow_run_id": prefect_id}
    started = utcnow()
    row = dict(
        run_id=run_id,
        kind=kind,
        name=name,
        config=config,
        code_version=code_version(),
        started_at=started,
        created_at=started,
    )
    wh.write([Run(**row, status="running")])
    try:
        yield
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"[:500]
        status = "cancelled" if isinstance(exc, KeyboardInterrupt) else "failed"  # Ctrl-C
        wh.write([Run(**row, status=status, error=error, ended_at=utcnow())])
        raise
    wh.write([Run(**row, status="completed", ended_at=utcnow())])
