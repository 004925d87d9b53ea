"""The ``judge`` flow: judge the backlog of one judge version (recorded as a ``judge`` run).

Thin: the work is in ``judging`` (registry, backlog, bounded-concurrency runner). Re-running the
same command judges only what is still missing, and retries stored judge errors until their
attempts are spent.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flows import prefect_env

prefect_env.configure()

from prefect import flow, task  # noqa: E402

from flows.runs import recorded_run  # noqa: E402
from judging.base import JudgeSummary, backlog, judge_all, make_judge  # noqa: E402
from warehouse import Warehouse, WarehouseConfig, WarehouseError  # noqa: E402
from warehouse.ids import run_id_for  # noqa: E402


@dataclass(frozen=True)
class JudgeConfig:
    """Which judge, with which options, over which trajectories."""

    judge: str = "programmatic"
    options: dict[str, Any] = field(default_factory=dict)  # base_url, model, k, members, …
    run: str | None = None  # only trajectories of this collect run
    concurrency: int = 8
    attempts: int = 2  # tries per trajectory in this run
    max_attempts: int = 4  # over all runs: errors beyond this stay errors

    def identity(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("concurrency")
        return d


def run_judge(
    wh: Warehouse, cfg: JudgeConfig, progress: Callable[[JudgeSummary], None] | None = None
) -> dict[str, Any]:
    """Judge the backlog of ``cfg``'s judge; returns a summary (also stored on the run)."""
    try:
        judge = make_judge(cfg.judge, **cfg.options)
    except (TypeError, ValueError) as exc:
        raise WarehouseError(f"judge {cfg.judge!r}: {exc}") from exc
    run_id = run_id_for("judge", cfg.identity())
    ids = backlog(wh, judge, cfg.run, cfg.max_attempts)

    async def work() -> JudgeSummary:
        try:
            return await judge_all(
                wh,
                judge,
                ids,
                concurrency=cfg.concurrency,
                attempts=cfg.attempts,
                run_id=run_id,
                progress=progress,
            )
        finally:
            client = getattr(judge, "client", None)
            if client is not None:
                await client.aclose()

    with recorded_run(wh, run_id, "judge", dataclasses.asdict(cfg)):
        summary = asyncio.run(work())
    return {
        "run_id": run_id,
        "judge": judge.name,
        "version": judge.version,
        "model": judge.model,
        "backlog": len(ids),
        "judged": summary.judged,
        "verdicts": dict(summary.verdicts),
        "errors": summary.errors,
        "error_examples": summary.error_examples,
        "calls_per_traj": summary.calls / summary.judged if summary.judged else 0.0,
        "images_per_traj": summary.images / summary.judged if summary.judged else 0.0,
        "line": summary.line(),
    }


@task(name="judge-backlog")
def judge_backlog(cfg: JudgeConfig, home: str | None = None) -> dict[str, Any]:
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        return run_judge(wh, cfg, prefect_env.progress_of("judge"))


@flow(name="judge")
def judge_flow(cfg: JudgeConfig, home: str | None = None) -> dict[str, Any]:
    """Judge every trajectory that has no verdict from this judge version yet."""
    return judge_backlog(cfg, home)


def judge(
    cfg: JudgeConfig,
    home: str | None = None,
    on_progress: Callable[[JudgeSummary], None] | None = None,
) -> dict[str, Any]:
    """Run the judge flow; ``on_progress`` gets the running summary after every chunk."""
    with prefect_env.progress_to("judge", on_progress):
        return judge_flow(cfg, home)
