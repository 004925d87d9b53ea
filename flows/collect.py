"""The ``collect`` flow: :func:`stages.collect.run_collect` as a Prefect flow, sharded across
Dask workers when the config asks (:func:`flows.dask_scale.run_sharded`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prefect import flow, task

from flows import dask_scale, prefect_env
from rollouts.engine import Stats
from stages import collect as stage
from stages.collect import CollectConfig, CollectResult
from warehouse import Warehouse, WarehouseConfig


# Browsers and HTTP fail transiently (a crashed Chromium, a refused connection): retried. Safe:
# a run resumes (stored trajectories are skipped, writes are idempotent by key). Bad input and a
# held lease (WarehouseError) are not retried.
@task(
    name="collect-rollouts",
    retries=dask_scale.RETRIES,
    retry_delay_seconds=dask_scale.RETRY_DELAY_S,
    retry_condition_fn=dask_scale.retry_unless_bad_input,
)
def collect_rollouts(cfg: CollectConfig, home: str | None = None) -> CollectResult:
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        return asyncio.run(stage.run_collect(wh, cfg, prefect_env.progress_of("collect")))


@flow(name="collect")
def collect_flow(cfg: CollectConfig, home: str | None = None) -> CollectResult:
    """Collect rollouts for ``cfg`` into the warehouse (recorded in ``runs``); sharded across
    Dask workers when ``cfg.workers`` or ``cfg.dask_address`` is set."""
    if dask_scale.sharded(cfg.workers, cfg.dask_address):
        return dask_scale.run_sharded(stage, cfg, home)
    return collect_rollouts(cfg, home)


def collect(
    cfg: CollectConfig, home: str | None = None, on_progress: Callable[[Stats], None] | None = None
) -> CollectResult:
    """Run the collect flow; ``on_progress`` receives engine stats about once a second (not
    when sharded: the engines run in the Dask workers). Prefect's temporary server, if it is
    the one used, runs detached, so that a Ctrl-C leaves it to record the interruption."""
    prefect_env.detach_temporary_server()
    if dask_scale.sharded(cfg.workers, cfg.dask_address):
        return dask_scale.run_flow(collect_flow, cfg.workers, cfg.dask_address, cfg, home)
    with prefect_env.progress_to("collect", on_progress):
        return collect_flow(cfg, home)
