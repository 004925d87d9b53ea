"""Stage results as Prefect markdown artifacts (visible on the flow run's page in the UI).

Flows call :func:`publish` from their tasks; outside a Prefect flow or task run (a library call,
a unit test without a server) it does nothing, so library code never needs a Prefect server."""

from __future__ import annotations

import re


def artifact_key(*parts: object) -> str:
    """A valid artifact key (lowercase letters, digits and dashes) from ``parts``."""
    text = "-".join(str(p) for p in parts if p is not None and str(p) != "")
    key = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return re.sub(r"-{2,}", "-", key)[:100] or "webloop"


def in_prefect_run() -> bool:
    """Whether this code runs inside a Prefect flow or task run."""
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def publish(key: str, markdown: str, description: str) -> str | None:
    """Create the markdown artifact ``key`` of the current run; its id, or None outside a run."""
    if not in_prefect_run():
        return None
    from prefect.artifacts import create_markdown_artifact

    return str(create_markdown_artifact(markdown=markdown, key=key, description=description))


def flow_run_id() -> str | None:
    """The id of the Prefect flow run this code runs in (None outside one)."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    return str(ctx.flow_run.id) if ctx is not None and ctx.flow_run is not None else None
