"""Scale-out on Dask: ``collect``, ``judge`` and ``score_steps`` shard their work across Dask
workers with ``prefect_dask.DaskTaskRunner``.

- ``workers=N``: a ``distributed.LocalCluster`` of N worker *processes* (one thread each), made
  for the flow run and closed after it.
- ``dask_address="tcp://host:8786"``: an existing cluster (``dask scheduler`` + ``dask worker``
  on each machine).

Every worker opens the warehouse from ITS OWN environment (``WEBLOOP_WAREHOUSE``,
``WEBLOOP_DATA_PATH``, ``WEBLOOP_BLOBS``, ``WEBLOOP_HOME``): local workers inherit the flow
process's; remote workers must be started with the same values (a PostgreSQL catalog and data
and blob locations every machine reaches under the same path or URL). Catalog URLs carry
passwords, so they are never task parameters (Prefect stores those); instead each shard reports
the flow passes the description (no password) of its warehouse and
:func:`check_same_warehouse` refuses to run a shard on another one.

A shard is idempotent (it skips what is stored), so Dask may rerun it when its worker dies, and
Prefect retries it on errors.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any, TypeVar

from prefect import task

from stages.config import ConfigError
from warehouse import Warehouse, WarehouseConfig, WarehouseError

T = TypeVar("T")

# Retries of the Prefect tasks that touch browsers and HTTP (collect, judge, score-steps): safe,
# because every stage resumes (skips what is stored) and writes idempotently by key.
RETRIES, RETRY_DELAY_S = 2, 5


def retry_unless_bad_input(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect retry condition: retry anything but bad input (:class:`ConfigError`) and a
    :class:`WarehouseError` (bad data, a held lease, a warehouse that outlasted its own
    retries)."""
    exc = getattr(state, "data", None)
    if not isinstance(exc, BaseException):
        try:
            state.result()
        except BaseException as raised:  # the state's stored exception
            exc = raised
    return not isinstance(exc, WarehouseError | ConfigError)


def sharded(workers: int, dask_address: str | None) -> bool:
    """Whether a run with these options runs on Dask (and checks them)."""
    if workers < 0:
        raise WarehouseError("--workers must be 0 (no Dask) or a positive number of processes")
    if dask_address is not None and not dask_address.strip():
        raise WarehouseError("--dask-address is empty: give tcp://HOST:PORT of a Dask scheduler")
    return workers > 0 or dask_address is not None


def task_runner(workers: int, dask_address: str | None) -> Any:
    """The ``DaskTaskRunner`` for these options: an existing cluster at ``dask_address``, else a
    ``LocalCluster`` of ``workers`` processes."""
    from prefect_dask import DaskTaskRunner

    if dask_address:
        return DaskTaskRunner(address=dask_address)
    return DaskTaskRunner(
        cluster_class="distributed.LocalCluster",
        cluster_kwargs={
            "n_workers": workers,
            "processes": True,
            "threads_per_worker": 1,
            "dashboard_address": None,
            # no worker memory manager: browsers are child processes, not the worker's heap
            "memory_limit": 0,
        },
    )


def shards(items: Sequence[T], n: int) -> list[list[T]]:
    """``items`` in at most ``n`` contiguous, non-empty shards of near-equal size."""
    n = max(1, min(n, len(items)))
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(list(items[start:end]))
        start = end
    return [s for s in out if s]


@contextlib.contextmanager
def prefect_api_for_workers() -> Iterator[str]:
    """A Prefect API the Dask worker processes can reach, in ``PREFECT_API_URL`` for the
    duration (worker processes inherit the environment when the cluster starts).

    Prefect's default — a temporary server started by the first flow call — lives only in the
    flow process's settings, so spawned workers cannot find it (their task runs crash with
    connection errors). An explicit ``PREFECT_API_URL`` is kept; a URL set only in the current
    settings (a test harness) is exported; otherwise a temporary server is started here and
    stopped afterwards. Remote workers (``dask_address``) need ``PREFECT_API_URL`` of a shared
    ``prefect server start`` in their own environment."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if os.environ.get("PREFECT_API_URL"):
        yield os.environ["PREFECT_API_URL"]
        return
    url = PREFECT_API_URL.value()
    server = None
    if not url:
        from prefect.server.api.server import SubprocessASGIServer

        server = SubprocessASGIServer()
        server.start(timeout=300)
        url = server.api_url
    os.environ["PREFECT_API_URL"] = url
    try:
        with temporary_settings({PREFECT_API_URL: url}):
            yield url
    finally:
        os.environ.pop("PREFECT_API_URL", None)
        if server is not None:
            server.stop()


def run_flow(flow_fn: Any, workers: int, dask_address: str | None, *args: Any) -> Any:
    """Call a Prefect flow with a Dask task runner for these options (and an API the workers
    reach)."""
    import dask
    import distributed  # noqa: F401  (its config defaults first: leaving set() drops new keys)

    # workers start a sites server process each: Dask's default daemonic workers cannot have
    # child processes (the setting reaches local workers; remote ones need it in their own
    # environment: DASK_DISTRIBUTED__WORKER__DAEMON=False)
    with (
        prefect_api_for_workers(),
        dask.config.set({"distributed.worker.daemon": False}),
        _env("DASK_DISTRIBUTED__WORKER__DAEMON", "False"),
    ):
        return flow_fn.with_options(task_runner=task_runner(workers, dask_address))(*args)


@contextlib.contextmanager
def _env(key: str, value: str) -> Iterator[None]:
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def cluster_size(workers: int, dask_address: str | None) -> int:
    """How many workers the run's cluster has: ``workers``, or those of the cluster at
    ``dask_address`` now."""
    if not dask_address:
        return workers
    from distributed import Client

    try:
        with Client(dask_address, timeout=30) as client:
            return max(1, len(client.scheduler_info().get("workers", {})))
    except OSError as exc:
        raise WarehouseError(f"cannot reach the Dask scheduler at {dask_address}: {exc}") from exc


def shard_count(n_workers: int, n_items: int, per_worker: int = 1) -> int:
    """How many shards: ``per_worker`` per worker (each shard starts its own sites server and
    browsers, so more shards cost start-ups), at most one per item."""
    return max(1, min(n_items, max(1, n_workers) * per_worker))


def warehouse_identity(cfg: WarehouseConfig) -> str:
    """What a shard reports about the warehouse it opened (no password)."""
    return f"{cfg.describe()} data={cfg.data_path}"


def check_same_warehouse(expected: str, cfg: WarehouseConfig) -> None:
    """Refuse to run a shard on another warehouse than the flow's (before writing anything)."""
    mine = warehouse_identity(cfg)
    if mine != expected:
        raise WarehouseError(
            f"this Dask worker opens another warehouse ({mine}) than the flow ({expected}): "
            "start every worker with the same WEBLOOP_WAREHOUSE, "
            "WEBLOOP_DATA_PATH and WEBLOOP_BLOBS"
        )


# -- the one sharded flow body -------------------------------------------------------------------


def run_sharded(stage: ModuleType, cfg: Any, home: str | None) -> Any:
    """The flow body of a sharded stage (:mod:`stages.shards`: collect, judge, score-steps) on
    Dask: its session records the run here, the items go out in shards (one task each, on the
    flow's Dask task runner), the results come back and the stage merges them."""
    n_workers = cluster_size(cfg.workers, cfg.dask_address)
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        where = warehouse_identity(wh.cfg)
        with stage.sharded_session(wh, cfg) as session:
            parts = shards(session.items, shard_count(n_workers, len(session.items)))
            name = stage.__name__.rsplit(".", 1)[-1]
            run = shard.with_options(name=f"{name}-shard")
            futures = [
                run.submit(stage.__name__, cfg, session.run_id, part, where, home) for part in parts
            ]
            results = [f.result() for f in futures]
            session.fence()
    return stage.merge_shards(cfg, session, results, n_workers)


@task(
    name="shard",
    retries=RETRIES,
    retry_delay_seconds=RETRY_DELAY_S,
    retry_condition_fn=retry_unless_bad_input,
)
def shard(
    stage_name: str, cfg: Any, run_id: str, items: list[Any], warehouse: str, home: str | None
) -> Any:
    """One Dask worker's share of a sharded stage's run, on the shared warehouse (the one the
    flow process described: :func:`check_same_warehouse`). The worker imports the modules of
    ``WEBLOOP_PLUGINS`` first (it inherits the variable), so a plugin's components are known."""
    from stages.plugins import load_plugins

    load_plugins()
    stage = importlib.import_module(stage_name)
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        check_same_warehouse(warehouse, wh.cfg)
        return stage.run_shard(wh, cfg, run_id, items)
