"""The ``collect`` flow: choose tasks, start the bundled sites when needed, run the rollout
engine with a policy, and record the run. Thin: the work is in ``rollouts`` (engine, writer) and
``sites`` (server, checkers); this module wires them together.

The run id is derived from the configuration (or given with ``--run``), so re-running the same
command resumes the same run: stored trajectories are skipped, unfinished ones are redone.

One collector writes a run at a time: the run's lease (``warehouse.leases``) is held while it
runs; a second collector on the same run waits up to ``lease_wait_s`` and then refuses, naming
the holder. With ``workers`` or ``dask_address`` the tasks are sharded across Dask workers
(:mod:`flows.dask_scale`): the flow process holds the lease and records the run, each worker
runs its own sites server and browsers and writes its shard to the shared warehouse.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from prefect import flow, task

from flows import dask_scale, prefect_env
from flows.grading import engine_grader
from rollouts.browser import SharedSlot
from rollouts.engine import Engine, EngineConfig, Job, Stats, make_jobs
from rollouts.env import BrowserEnv, EnvConfig, origin_of
from rollouts.policies import expert_action_space, make_policy
from rollouts.prompts import PromptConfig
from rollouts.writer import BatchWriter, WriterStats
from sites.server import SiteServer
from sites.tasks import BUNDLED_SCHEME, resolve_start_url
from stages.runs import recorded_run
from warehouse import Warehouse, WarehouseConfig, WarehouseError
from warehouse.ids import run_id_for, stable_hash, traj_id_for
from warehouse.leases import Claim, hold
from warehouse.records import INFRA_ERROR, Task
from warehouse.tasks import latest_tasks

VOLATILE = ("concurrency", "run_name", "workers", "dask_address", "lease_wait_s")


class CollectInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a collect run: what finished is stored, the episodes in flight are not
    (a re-run of the same command runs them). Its message is the one line the CLI prints."""


@dataclass(frozen=True)
class CollectConfig:
    """What to collect. Everything but ``concurrency`` and ``run_name`` names the run."""

    suite: str = "bundled"
    split: str | None = "train"
    n_tasks: int = 50
    samples: int = 1
    policy: str = "expert"
    noise: float = 0.0
    base_url: str | None = None
    model: str | None = None
    max_steps: int = 30
    action_timeout_s: float = 10.0  # how long an action waits for its element / navigation
    seed: int = 0
    site_seed: int = 0
    allow_origins: tuple[str, ...] = ()
    coords: str = "pixels"
    set_of_marks: bool = False
    prompt_mode: str = "both"
    k_images: int = 3
    self_summary: bool = False
    inject_answer: bool = False  # expert: adversarial answers (judge robustness)
    # None: captured unless the prompt shows none (prompt_mode "a11y": text-only policies, fast)
    screenshots: bool | None = None
    temperature: float = 0.0  # model policies (hf, ranker, openai): 0 greedy, else sampled
    concurrency: int = 8  # trajectories at once (per Dask worker when sharded)
    run_name: str | None = None
    engine: dict[str, Any] = field(default_factory=dict)  # extra EngineConfig fields
    workers: int = 0  # > 0: shard across a local Dask cluster of this many worker processes
    dask_address: str | None = None  # shard across this existing Dask cluster (tcp://host:port)
    lease_wait_s: float = 0.0  # another collector holds the run: wait this long, then refuse
    # these tasks of the suite/split, in this order, instead of the first ``n_tasks`` of the
    # seeded order (the RL loop's failures-first curriculum picks them); () = the seeded order
    task_ids: tuple[str, ...] = ()

    def identity(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for volatile in VOLATILE:
            d.pop(volatile)
        if not d["inject_answer"]:
            d.pop("inject_answer")  # added later: keeps earlier runs' ids (and resumes) stable
        if d["action_timeout_s"] == 10.0:
            d.pop("action_timeout_s")  # likewise
        if not d["task_ids"]:
            d.pop("task_ids")  # added later: keeps earlier runs' ids (and resumes) stable
        for later in ("screenshots", "temperature"):  # added later, defaults keep old ids
            if d[later] == CollectConfig.__dataclass_fields__[later].default:
                d.pop(later)
        if self.policy == "expert":
            # the expert's actions are written in the model-facing space these options choose
            # (rollouts.grounding); a change of that space is another run, not a resume
            d["action_space"] = expert_action_space(self.prompt_mode, self.set_of_marks)
        return d


def select_tasks(wh: Warehouse, cfg: CollectConfig) -> list[Task]:
    """The first ``n_tasks`` tasks of the suite/split in a seeded, stable order (or, given
    ``task_ids``, those tasks in that order)."""
    from warehouse.records import from_frame

    df = latest_tasks(
        wh,
        "suite = $suite AND ($split IS NULL OR split = $split)",
        {"suite": cfg.suite, "split": cfg.split},
    )
    if df.is_empty():
        hint = " (run: webloop tasks generate)" if cfg.suite == "bundled" else ""
        raise WarehouseError(f"no tasks in suite {cfg.suite!r}, split {cfg.split!r}{hint}")
    tasks = from_frame(Task, df)
    if cfg.task_ids:
        by_id = {t.task_id: t for t in tasks}
        missing = [t for t in cfg.task_ids if t not in by_id]
        if missing:
            raise WarehouseError(
                f"{len(missing)} of the given tasks are not in suite {cfg.suite!r}, split "
                f"{cfg.split!r}: {missing[:5]}"
            )
        return [by_id[t] for t in cfg.task_ids]
    tasks.sort(key=lambda t: stable_hash(cfg.seed, t.task_id))
    return tasks[: cfg.n_tasks]


def prompt_config(cfg: CollectConfig) -> PromptConfig:
    if cfg.prompt_mode not in ("screenshot", "a11y", "both"):
        raise WarehouseError("--prompt-mode is screenshot, a11y or both")
    return PromptConfig(mode=cfg.prompt_mode, k_images=cfg.k_images, self_summary=cfg.self_summary)


def make_policy_for(cfg: CollectConfig) -> Any:
    if cfg.policy == "expert":
        return make_policy(
            "expert",
            noise=cfg.noise,
            inject_answer=cfg.inject_answer,
            action_space=expert_action_space(cfg.prompt_mode, cfg.set_of_marks),
            coords=cfg.coords,
            prompt=prompt_config(cfg),
        )
    if cfg.policy == "openai":
        if not cfg.base_url or not cfg.model:
            raise WarehouseError("--policy openai needs --base-url and --model")
        return make_policy(
            "openai",
            base_url=cfg.base_url,
            model=cfg.model,
            prompt=prompt_config(cfg),
            temperature=cfg.temperature,
        )
    if cfg.policy in ("hf", "ranker"):
        return checkpoint_policy(cfg.policy, cfg.model, prompt_config(cfg), cfg.temperature)
    return make_policy(cfg.policy)


def checkpoint_policy(
    name: str, model: str | None, prompt: PromptConfig, temperature: float
) -> Any:
    """A trained checkpoint folder as a rollout policy: ``hf`` (a VLM) or ``ranker``."""
    import rollouts.hf  # (registers the policies)
    import rollouts.ranker  # noqa: F401

    if not model:
        raise WarehouseError(f"--policy {name} needs --model (a checkpoint folder)")
    return make_policy(name, model_path=model, prompt=prompt, temperature=temperature)


def env_config(cfg: CollectConfig) -> EnvConfig:
    if cfg.coords not in ("pixels", "norm1000"):
        raise WarehouseError("--coords is pixels or norm1000")
    if cfg.action_timeout_s <= 0:
        raise WarehouseError("--action-timeout must be positive (seconds)")
    return EnvConfig(
        coords=cfg.coords,
        set_of_marks=cfg.set_of_marks,
        action_timeout_s=cfg.action_timeout_s,
        screenshots=captures_screenshots(cfg),
    )


def captures_screenshots(cfg: CollectConfig) -> bool:
    """Whether the run's environment captures screenshots: as asked, else unless the prompt
    shows none (set-of-marks needs them)."""
    if cfg.screenshots is not None:
        return cfg.screenshots
    return cfg.prompt_mode != "a11y" or cfg.set_of_marks


# The engine's grader (flows.grading.engine_grader), under the name other modules import.
bundled_grader = engine_grader


def _lease_waiting(run_id: str, wait_s: float) -> Callable[[Claim], None]:
    def say(holder: Claim) -> None:
        print(
            f"run {run_id} is being written by another collector ({holder.describe()}); "
            f"waiting up to {wait_s:.0f} s for it",
            file=sys.stderr,
        )

    return say


def stored_statuses(wh: Warehouse, run_id: str) -> dict[str, str]:
    """traj_id → status of the run's stored trajectories."""
    return dict(
        wh.sql("SELECT traj_id, status FROM trajectories WHERE run_id = ?", [run_id]).iter_rows()
    )


def pending_tasks(tasks: list[Task], run_id: str, samples: int, done: dict[str, str]) -> list[Task]:
    """The tasks with a sample not stored yet (or stored as an infrastructure error)."""
    return [
        t
        for t in tasks
        if any(
            done.get(traj_id_for(run_id, t.task_id, k)) in (None, INFRA_ERROR)
            for k in range(samples)
        )
    ]


async def run_collect(
    wh: Warehouse,
    cfg: CollectConfig,
    on_progress: Callable[[Stats], None] | None = None,
    *,
    server: SiteServer | None = None,
    browser: Any = None,
) -> dict[str, Any]:
    """Collect (or resume) the run described by ``cfg``; return a summary.

    ``server``: running bundled sites to use (their seed must be ``cfg.site_seed``); by default
    a sites server process is started, only when some bundled trajectory still needs running.
    ``browser``: a launched Playwright Chromium of the calling event loop, shared by all
    trajectories (a context each) and left open; by default each worker launches its own, only
    when there is work."""
    if server is not None and server.seed != cfg.site_seed:
        raise WarehouseError(
            f"the given sites server has seed {server.seed}, the run needs {cfg.site_seed}"
        )
    run_id = run_id_for("collect", cfg.identity(), cfg.run_name)
    tasks = select_tasks(wh, cfg)
    policy = make_policy_for(cfg)
    with (
        hold(
            wh,
            run_id,
            holder="collect",
            wait_s=cfg.lease_wait_s,
            on_wait=_lease_waiting(run_id, cfg.lease_wait_s),
        ) as lease,
        recorded_run(wh, run_id, "collect", dataclasses.asdict(cfg), cfg.run_name),
    ):
        done = stored_statuses(wh, run_id)  # read under the lease: no other writer now
        stats, wstats, jobs = await _collect(
            wh, cfg, run_id, tasks, policy, done, on_progress, server, browser, lease.check
        )
        if stats.stopped:
            raise CollectInterrupted(_interrupted_line(run_id, stats, wstats.trajectories))
        lease.check()
    return {
        "run_id": run_id,
        "tasks": len(tasks),
        "skipped": len(tasks) * cfg.samples - len(jobs),
        "ran": len(jobs),
        "by_status": stats.by_status,
        "steps": stats.steps,
        "steps_per_s": round(stats.steps_per_s, 2),
        "written": wstats.trajectories,
        "transactions": wstats.transactions,
    }


async def _collect(
    wh: Warehouse,
    cfg: CollectConfig,
    run_id: str,
    tasks: list[Task],
    policy: Any,
    done: dict[str, str],
    on_progress: Callable[[Stats], None] | None,
    server: SiteServer | None = None,
    browser: Any = None,
    fence: Callable[[], None] | None = None,
) -> tuple[Stats, Any, list[Job]]:
    """Start the sites when needed (unless given), run the engine over what is not stored yet,
    write. Nothing to run: no server, no browser, no writer. ``fence`` runs before every
    trajectory is handed to the writer (the lease check: a collector that lost its lease stops
    writing)."""
    pending = pending_tasks(tasks, run_id, cfg.samples, done)
    if not pending:
        if hasattr(policy, "aclose"):
            await policy.aclose()
        return Stats(), WriterStats(), []
    bundled = any(t.start_url.startswith(BUNDLED_SCHEME) for t in pending)
    own_server = server is None and bundled
    if own_server:
        server = SiteServer(seed=cfg.site_seed, mode="process").start()
    try:

        def resolve(t: Task) -> tuple[str, list[str]]:
            url = resolve_start_url(t.start_url, server.urls) if server else t.start_url
            return url, [origin_of(url), *cfg.allow_origins]

        jobs = [
            j
            for j in make_jobs(run_id, pending, cfg.samples, resolve)
            if done.get(j.traj_id) in (None, INFRA_ERROR)
        ]
        engine_cfg = EngineConfig(
            concurrency=cfg.concurrency,
            samples=cfg.samples,
            max_steps=cfg.max_steps,
            seed=cfg.seed,
            **cfg.engine,
        )
        env_cfg = env_config(cfg)
        shared = SharedSlot(browser) if browser is not None else None
        async with httpx.AsyncClient() as client:
            writer = BatchWriter(wh).start()

            async def put(finished: Any) -> None:
                if fence is not None:
                    fence()
                await writer.put(finished)

            engine = Engine(
                run_id,
                policy,
                engine_grader(server, client),
                put,
                config=engine_cfg,
                env_config=env_cfg,
                on_progress=on_progress,
                env_factory=(lambda: BrowserEnv(shared, env_cfg)) if shared else None,
            )
            undo = _stop_on_ctrl_c(engine)
            try:
                stats = await engine.run(jobs)
            finally:
                undo()
                wstats = await writer.close()
    finally:
        if own_server and server is not None:
            server.stop()
        if hasattr(policy, "aclose"):
            await policy.aclose()
    return stats, wstats, jobs


def _interrupted_line(run_id: str, stats: Stats, written: int) -> str:
    """The one line that says what a Ctrl-C left behind."""
    not_started = max(0, stats.total - stats.finished - stats.interrupted)
    return (
        f"interrupted: run {run_id} stopped; {written} finished trajectories stored, "
        f"{stats.interrupted} in flight and {not_started} not started are not; re-run the same "
        "command to run them"
    )


def _stop_on_ctrl_c(engine: Engine) -> Callable[[], None]:
    """Make the first Ctrl-C (SIGINT) stop ``engine`` (:meth:`Engine.interrupt`: what finished is
    written, the episodes in flight are dropped); a second one raises KeyboardInterrupt at once.
    Returns the undo. Only in the main thread of a Unix process (elsewhere: a no-op)."""
    loop = asyncio.get_running_loop()

    def first() -> None:
        loop.remove_signal_handler(signal.SIGINT)  # the next Ctrl-C: KeyboardInterrupt
        engine.interrupt()

    try:
        loop.add_signal_handler(signal.SIGINT, first)
    except (ValueError, RuntimeError, NotImplementedError):  # not the main thread / not Unix
        return lambda: None
    return lambda: loop.remove_signal_handler(signal.SIGINT)


# Browsers and HTTP fail transiently (a crashed Chromium, a refused connection): the tasks are
# retried (flows.dask_scale.RETRIES). Safe: a run resumes (stored trajectories are skipped,
# writes are idempotent by key). Bad input and a held lease (WarehouseError) are not retried.
RETRIES, RETRY_DELAY_S = dask_scale.RETRIES, dask_scale.RETRY_DELAY_S
retry_unless_bad_input = dask_scale.retry_unless_bad_input


@task(
    name="collect-rollouts",
    retries=RETRIES,
    retry_delay_seconds=RETRY_DELAY_S,
    retry_condition_fn=retry_unless_bad_input,
)
def collect_rollouts(cfg: CollectConfig, home: str | None = None) -> dict[str, Any]:
    """Run the engine (library code) for the run; resumable, so Prefect retries are safe."""
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        return asyncio.run(run_collect(wh, cfg, prefect_env.progress_of("collect")))


@task(
    name="collect-shard",
    retries=RETRIES,
    retry_delay_seconds=RETRY_DELAY_S,
    retry_condition_fn=retry_unless_bad_input,
)
def collect_shard(
    cfg: CollectConfig, run_id: str, task_ids: list[str], warehouse: str, home: str | None = None
) -> dict[str, Any]:
    """One Dask worker's share of a run: the given tasks, with its own sites server and
    browsers, written to the shared warehouse (described by ``warehouse``; the flow process
    holds the run's lease). Skips what is stored, so a rerun after a dead worker is safe."""
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        dask_scale.check_same_warehouse(warehouse, wh.cfg)
        wanted = set(task_ids)
        tasks = [t for t in select_tasks(wh, cfg) if t.task_id in wanted]
        done = stored_statuses(wh, run_id)
        stats, wstats, jobs = asyncio.run(
            _collect(wh, cfg, run_id, tasks, make_policy_for(cfg), done, None)
        )
    return {
        "ran": len(jobs),
        "by_status": dict(stats.by_status),
        "steps": stats.steps,
        "written": wstats.trajectories,
        "transactions": wstats.transactions,
    }


def collect_sharded(wh: Warehouse, cfg: CollectConfig, home: str | None) -> dict[str, Any]:
    """The flow body on Dask: hold the lease and record the run here, shard the pending tasks
    across the workers, add up what they did."""
    run_id = run_id_for("collect", cfg.identity(), cfg.run_name)
    tasks = select_tasks(wh, cfg)
    make_policy_for(cfg)  # bad policy options fail here, before any worker starts
    env_config(cfg)
    n_workers = dask_scale.cluster_size(cfg.workers, cfg.dask_address)
    with (
        hold(
            wh,
            run_id,
            holder="collect (dask)",
            wait_s=cfg.lease_wait_s,
            on_wait=_lease_waiting(run_id, cfg.lease_wait_s),
        ) as lease,
        recorded_run(wh, run_id, "collect", dataclasses.asdict(cfg), cfg.run_name),
    ):
        pending = pending_tasks(tasks, run_id, cfg.samples, stored_statuses(wh, run_id))
        parts = dask_scale.shards(
            [t.task_id for t in pending], dask_scale.shard_count(n_workers, len(pending))
        )
        where = dask_scale.warehouse_identity(wh.cfg)
        futures = [collect_shard.submit(cfg, run_id, part, where, home) for part in parts]
        results = [f.result() for f in futures]
        lease.check()
    by_status: dict[str, int] = {}
    for r in results:
        for k, v in r["by_status"].items():
            by_status[k] = by_status.get(k, 0) + v
    ran = sum(r["ran"] for r in results)
    return {
        "run_id": run_id,
        "tasks": len(tasks),
        "skipped": len(tasks) * cfg.samples - ran,
        "ran": ran,
        "by_status": by_status,
        "steps": sum(r["steps"] for r in results),
        "steps_per_s": 0.0,
        "written": sum(r["written"] for r in results),
        "transactions": sum(r["transactions"] for r in results),
        "shards": len(parts),
        "workers": n_workers,
    }


@flow(name="collect")
def collect_flow(cfg: CollectConfig, home: str | None = None) -> dict[str, Any]:
    """Collect rollouts for ``cfg`` into the warehouse (recorded in ``runs``); sharded across
    Dask workers when ``cfg.workers`` or ``cfg.dask_address`` is set."""
    if dask_scale.sharded(cfg.workers, cfg.dask_address):
        with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
            return collect_sharded(wh, cfg, home)
    return collect_rollouts(cfg, home)


def collect(
    cfg: CollectConfig, home: str | None = None, on_progress: Callable[[Stats], None] | None = None
) -> dict[str, Any]:
    """Run the collect flow; ``on_progress`` receives engine stats about once a second (not
    when sharded: the engines run in the Dask workers)."""
    if dask_scale.sharded(cfg.workers, cfg.dask_address):
        return dask_scale.run_flow(collect_flow, cfg.workers, cfg.dask_address, cfg, home)
    with prefect_env.progress_to("collect", on_progress):
        return collect_flow(cfg, home)
