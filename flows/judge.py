"""The ``judge`` flow: judge the backlog of one judge version (recorded as a ``judge`` run).

Thin: the work is in ``judging`` (registry, backlog, bounded-concurrency runner). Re-running the
same command judges only what is still missing, and retries stored judge errors until their
attempts are spent. With ``workers`` or ``dask_address`` the backlog is sharded across Dask
workers (:mod:`flows.dask_scale`), each with its own judge (and model-server connections).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prefect import flow, task

from flows import dask_scale, prefect_env
from flows.dask_scale import RETRIES, RETRY_DELAY_S, retry_unless_bad_input
from judging.base import Judge, JudgeSummary, backlog, judge_all, make_judge
from stages.runs import recorded_run
from warehouse import Warehouse, WarehouseConfig, WarehouseError
from warehouse.ids import run_id_for


@dataclass(frozen=True)
class JudgeConfig:
    """Which judge, with which options, over which trajectories."""

    judge: str = "programmatic"
    options: dict[str, Any] = field(default_factory=dict)  # base_url, model, k, members, …
    run: str | None = None  # only trajectories of this collect run
    concurrency: int = 8
    attempts: int = 2  # tries per trajectory in this run
    max_attempts: int = 4  # over all runs: errors beyond this stay errors
    workers: int = 0  # > 0: shard the backlog across a local Dask cluster of this many processes
    dask_address: str | None = None  # shard across this existing Dask cluster

    def identity(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for volatile in ("concurrency", "workers", "dask_address"):
            d.pop(volatile)
        return d


def build_judge(cfg: JudgeConfig) -> Judge:
    try:
        return make_judge(cfg.judge, **cfg.options)
    except (TypeError, ValueError) as exc:
        raise WarehouseError(f"judge {cfg.judge!r}: {exc}") from exc


def judge_ids(
    wh: Warehouse,
    cfg: JudgeConfig,
    judge: Judge,
    ids: list[str],
    run_id: str,
    progress: Callable[[JudgeSummary], None] | None = None,
) -> JudgeSummary:
    """Judge ``ids`` (its own event loop); closes the judge's HTTP client."""

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

    return asyncio.run(work())


def run_judge(
    wh: Warehouse, cfg: JudgeConfig, progress: Callable[[JudgeSummary], None] | None = None
) -> dict[str, Any]:
    """Judge the backlog of ``cfg``'s judge; returns a summary (also stored on the run)."""
    judge = build_judge(cfg)
    run_id = run_id_for("judge", cfg.identity())
    ids = backlog(wh, judge, cfg.run, cfg.max_attempts)
    with recorded_run(wh, run_id, "judge", dataclasses.asdict(cfg)):
        summary = judge_ids(wh, cfg, judge, ids, run_id, progress)
    return summary_of(run_id, judge, ids, summary)


def summary_of(run_id: str, judge: Judge, ids: list[str], summary: JudgeSummary) -> dict[str, Any]:
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


# Judges call model servers over HTTP: retried (a retry judges only what is still missing).
@task(
    name="judge-backlog",
    retries=RETRIES,
    retry_delay_seconds=RETRY_DELAY_S,
    retry_condition_fn=retry_unless_bad_input,
)
def judge_backlog(cfg: JudgeConfig, home: str | None = None) -> dict[str, Any]:
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        return run_judge(wh, cfg, prefect_env.progress_of("judge"))


@task(
    name="judge-shard",
    retries=RETRIES,
    retry_delay_seconds=RETRY_DELAY_S,
    retry_condition_fn=retry_unless_bad_input,
)
def judge_shard(
    cfg: JudgeConfig, run_id: str, ids: list[str], warehouse: str, home: str | None = None
) -> dict[str, Any]:
    """One Dask worker's share of the backlog; skips what got a verdict meanwhile (a rerun
    after a dead worker judges only the rest)."""
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        dask_scale.check_same_warehouse(warehouse, wh.cfg)
        judge = build_judge(cfg)
        still = set(backlog(wh, judge, cfg.run, cfg.max_attempts))
        summary = judge_ids(wh, cfg, judge, [i for i in ids if i in still], run_id)
    return dataclasses.asdict(summary)


def judge_sharded(wh: Warehouse, cfg: JudgeConfig, home: str | None) -> dict[str, Any]:
    """The flow body on Dask: record the run here, shard the backlog, add up the shards."""
    judge = build_judge(cfg)
    run_id = run_id_for("judge", cfg.identity())
    ids = backlog(wh, judge, cfg.run, cfg.max_attempts)
    n_workers = dask_scale.cluster_size(cfg.workers, cfg.dask_address)
    total = JudgeSummary()
    with recorded_run(wh, run_id, "judge", dataclasses.asdict(cfg)):
        parts = dask_scale.shards(ids, dask_scale.shard_count(n_workers, len(ids)))
        where = dask_scale.warehouse_identity(wh.cfg)
        futures = [judge_shard.submit(cfg, run_id, part, where, home) for part in parts]
        for f in futures:
            part = f.result()
            total.judged += part["judged"]
            total.verdicts += Counter(part["verdicts"])
            total.errors += part["errors"]
            total.calls += part["calls"]
            total.images += part["images"]
            total.seconds = max(total.seconds, part["seconds"])
            total.error_examples += part["error_examples"][: 5 - len(total.error_examples)]
    return {**summary_of(run_id, judge, ids, total), "shards": len(parts)}


@flow(name="judge")
def judge_flow(cfg: JudgeConfig, home: str | None = None) -> dict[str, Any]:
    """Judge every trajectory that has no verdict from this judge version yet (sharded across
    Dask workers when ``cfg.workers`` or ``cfg.dask_address`` is set)."""
    if dask_scale.sharded(cfg.workers, cfg.dask_address):
        with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
            return judge_sharded(wh, cfg, home)
    return judge_backlog(cfg, home)


def judge(
    cfg: JudgeConfig,
    home: str | None = None,
    on_progress: Callable[[JudgeSummary], None] | None = None,
) -> dict[str, Any]:
    """Run the judge flow; ``on_progress`` gets the running summary after every chunk (not when
    sharded: the judges run in the Dask workers)."""
    if dask_scale.sharded(cfg.workers, cfg.dask_address):
        return dask_scale.run_flow(judge_flow, cfg.workers, cfg.dask_address, cfg, home)
    with prefect_env.progress_to("judge", on_progress):
        return judge_flow(cfg, home)
