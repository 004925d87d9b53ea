"""webloop's scheduled deployments (``webloop deploy``).

* ``judge-backlog`` — the ``judge`` flow with the programmatic judge, hourly;
* ``nightly-eval-ood`` — ``evaluate_newest``: the newest registered checkpoint on the ``ood``
  split, every night;
* ``weekly-maintenance`` — ``maintain_warehouse``, every week.

:func:`deployments` builds them (``flow.to_deployment(name, cron=..., parameters=...)``);
:func:`register` applies them to the Prefect server without running anything (the schedules show
in the UI, and a later ``serve`` picks them up); :func:`serve` registers them and runs their
scheduled flow runs in this process until it is stopped (Ctrl-C / SIGTERM pauses the schedules).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Schedule:
    """One deployment: its name, the flow (by webloop's name), cron, default parameters."""

    name: str
    flow: str
    cron: str
    parameters: dict[str, Any] = field(default_factory=dict)
    description: str = ""


HOURLY, NIGHTLY, WEEKLY = "0 * * * *", "0 2 * * *", "0 4 * * 0"


def schedules(
    home: str | None = None,
    *,
    judge: str = "programmatic",
    judge_cron: str = HOURLY,
    eval_cron: str = NIGHTLY,
    eval_split: str = "ood",
    eval_n: int = 100,
    maintain_cron: str = WEEKLY,
    keep_recent_minutes: float = 60.0,
) -> list[Schedule]:
    """webloop's three schedules; ``home`` (the warehouse home) is passed to every run."""
    for label, cron in (("judge", judge_cron), ("eval", eval_cron), ("maintain", maintain_cron)):
        check_cron(cron, f"--{label}-cron")
    if eval_n < 1:
        raise ValueError(f"--eval-n must be at least 1, got {eval_n}")
    return [
        Schedule(
            "judge-backlog",
            "judge",
            judge_cron,
            {"cfg": {"judge": judge}, "home": home},
            f"Judge every trajectory without a {judge} verdict yet.",
        ),
        Schedule(
            f"nightly-eval-{eval_split}",
            "evaluate_newest",
            eval_cron,
            {"split": eval_split, "n": eval_n, "home": home},
            f"Evaluate the newest checkpoint on the {eval_split} split.",
        ),
        Schedule(
            "weekly-maintenance",
            "maintain_warehouse",
            maintain_cron,
            {"keep_recent_minutes": keep_recent_minutes, "home": home},
            "Compact the warehouse; expire unpinned snapshots.",
        ),
    ]


def check_cron(expr: str, option: str) -> None:
    """Refuse a cron expression Prefect's scheduler would not accept, naming the option."""
    from prefect._internal.schemas.validators import validate_cron_string

    try:
        validate_cron_string(expr)
    except ValueError as exc:
        msg = f"{option}: {expr!r} is not a cron expression (e.g. '0 * * * *'): {exc}"
        raise ValueError(msg) from None


def flow_of(name: str) -> Any:
    """The Prefect flow object of a schedule's flow name."""
    if name == "judge":
        from flows.judge import judge_flow

        return judge_flow
    if name == "evaluate_newest":
        from flows.evaluate import evaluate_newest_flow

        return evaluate_newest_flow
    if name == "maintain_warehouse":
        from flows.maintain import maintain_warehouse

        return maintain_warehouse
    raise ValueError(
        f"no flow {name!r} to schedule; known: judge, evaluate_newest, maintain_warehouse"
    )


def deployments(items: list[Schedule]) -> list[Any]:
    """Prefect ``RunnerDeployment``s of the schedules (nothing is sent to a server yet)."""
    return [
        flow_of(s.flow).to_deployment(
            s.name,
            cron=s.cron,
            parameters=s.parameters,
            description=s.description,
            tags=["webloop"],
        )
        for s in items
    ]


def api_url() -> str | None:
    """The Prefect API this process talks to (None: a temporary server of its own)."""
    import prefect.settings

    return prefect.settings.PREFECT_API_URL.value() or None


def register(items: list[Schedule]) -> list[str]:
    """Create or update the deployments on the Prefect server; their ids."""
    return [str(d.apply()) for d in deployments(items)]


def serve(items: list[Schedule], limit: int | None = None) -> None:
    """Register the deployments and run their scheduled flow runs here until stopped."""
    from prefect import serve as prefect_serve

    prefect_serve(*deployments(items), limit=limit, print_starting_message=True)
