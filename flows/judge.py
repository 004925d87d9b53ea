"""The ``judge`` flow: :func:`stages.judge.run_judge` as a Prefect flow (sharded across Dask
workers when the config asks)."""

from __future__ import annotations

from collections.abc import Callable

from prefect import flow, task

from flows import dask_scale, prefect_env
from judging.base import JudgeSummary
from stages import judge as stage
from stages.judge import JudgeConfig, JudgeResult
from warehouse import Warehouse, WarehouseConfig


# Judges call model servers over HTTP: retried (a retry judges only what is still missing).
@task(
    name="judge-backlog",
    retries=dask_scale.RETRIES,
    retry_delay_seconds=dask_scale.RETRY_DELAY_S,
    retry_condition_fn=dask_scale.retry_unless_bad_input,
)
def judge_backlog(cfg: JudgeConfig, home: str | None = None) -> JudgeResult:
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        return stage.run_judge(wh, cfg, prefect_env.progress_of("judge"))


@flow(name="judge")
def judge_flow(cfg: JudgeConfig, home: str | None = None) -> JudgeResult:
    """Judge every trajectory that has no verdict from this judge version yet (sharded across
    Dask workers when ``cfg.workers`` or ``cfg.dask_address`` is set)."""
    if dask_scale.sharded(cfg.workers, cfg.dask_address):
        return dask_scale.run_sharded(stage, cfg, home)
    return judge_backlog(cfg, home)


def judge(
    cfg: JudgeConfig,
    home: str | None = None,
    on_progress: Callable[[JudgeSummary], None] | None = None,
) -> JudgeResult:
    """Run the judge flow; ``on_progress`` gets the running summary after every chunk (not when
    sharded: the judges run in the Dask workers)."""
    if dask_scale.sharded(cfg.workers, cfg.dask_address):
        return dask_scale.run_flow(judge_flow, cfg.workers, cfg.dask_address, cfg, home)
    with prefect_env.progress_to("judge", on_progress):
        return judge_flow(cfg, home)
