"""The ``runs`` row of a stage run: its full configuration and code version, written as
``running`` when it starts and ``completed``, ``failed`` (with the error) or ``cancelled``
(Ctrl-C) when it ends.

Stages know nothing of the orchestrator that runs them. When one does (Prefect, in ``flows``),
it sets :data:`orchestrator_run` to a function that returns its run's id, and every run recorded
meanwhile names it in its config (``flow_run_id``: the run's page in the Prefect UI)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from warehouse.records import Run, utcnow
from warehouse.store import Warehouse


def _no_orchestrator() -> str | None:
    return None


#: Set by the orchestrator (``flows`` sets Prefect's flow-run id): the id of its current run.
orchestrator_run: Callable[[], str | None] = _no_orchestrator


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
    """Record the run around the ``with`` body; its start time survives the final update. Run by
    an orchestrator, the config also names its run (:data:`orchestrator_run`)."""
    outer = orchestrator_run()
    if outer is not None:
        config = {**config, "flow_run_id": outer}
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
