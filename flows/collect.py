"""The ``collect`` flow: choose tasks, start the bundled sites when needed, run the rollout
engine with a policy, and record the run. Thin: the work is in ``rollouts`` (engine, writer) and
``sites`` (server, checkers); this module wires them together.

The run id is derived from the configuration (or given with ``--run``), so re-running the same
command resumes the same run: stored trajectories are skipped, unfinished ones are redone.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flows import prefect_env

prefect_env.configure()

import httpx  # noqa: E402
from prefect import flow, task  # noqa: E402

from flows.runs import recorded_run  # noqa: E402
from rollouts.browser import SharedSlot  # noqa: E402
from rollouts.engine import Engine, EngineConfig, Job, Outcome, Stats, make_jobs  # noqa: E402
from rollouts.env import BrowserEnv, EnvConfig, origin_of  # noqa: E402
from rollouts.policies import expert_action_space, make_policy  # noqa: E402
from rollouts.prompts import PromptConfig  # noqa: E402
from rollouts.writer import BatchWriter, WriterStats  # noqa: E402
from sites.grading import grade_session  # noqa: E402
from sites.server import SiteServer  # noqa: E402
from sites.tasks import BUNDLED_SCHEME, resolve_start_url  # noqa: E402
from warehouse import Warehouse, WarehouseConfig, WarehouseError  # noqa: E402
from warehouse.ids import run_id_for, stable_hash, traj_id_for  # noqa: E402
from warehouse.records import INFRA_ERROR, Task  # noqa: E402
from warehouse.tasks import latest_tasks  # noqa: E402


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
    concurrency: int = 8
    run_name: str | None = None
    engine: dict[str, Any] = field(default_factory=dict)  # extra EngineConfig fields

    def identity(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for volatile in ("concurrency", "run_name"):
            d.pop(volatile)
        if not d["inject_answer"]:
            d.pop("inject_answer")  # added later: keeps earlier runs' ids (and resumes) stable
        if d["action_timeout_s"] == 10.0:
            d.pop("action_timeout_s")  # likewise
        for later in ("screenshots", "temperature"):  # added later, defaults keep old ids
            if d[later] == CollectConfig.__dataclass_fields__[later].default:
                d.pop(later)
        if self.policy == "expert":
            # the expert's actions are written in the model-facing space these options choose
            # (rollouts.grounding); a change of that space is another run, not a resume
            d["action_space"] = expert_action_space(self.prompt_mode, self.set_of_marks)
        return d


def select_tasks(wh: Warehouse, cfg: CollectConfig) -> list[Task]:
    """The first ``n_tasks`` tasks of the suite/split in a seeded, stable order."""
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
        import rollouts.hf  # (registers the policies)
        import rollouts.ranker  # noqa: F401

        if not cfg.model:
            raise WarehouseError(f"--policy {cfg.policy} needs --model (a checkpoint folder)")
        return make_policy(
            cfg.policy,
            model_path=cfg.model,
            prompt=prompt_config(cfg),
            temperature=cfg.temperature,
        )
    return make_policy(cfg.policy)


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


def bundled_grader(server: SiteServer | None, client: httpx.AsyncClient) -> Callable:
    """Programmatic grading for bundled tasks; other tasks end as ``finished`` (judged later)."""

    async def grade(env: BrowserEnv, job: Job, answer: str | None) -> Outcome:
        t = job.task
        if server is None or not t.start_url.startswith(BUNDLED_SCHEME):
            return Outcome("finished")
        verdict = await grade_session(client, server, t, env.cookies, answer)
        return Outcome(
            "success" if verdict.success else "failure", {"criteria": verdict.to_dict()["criteria"]}
        )

    return grade


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
    done = {
        tid: st
        for tid, st in wh.sql(
            "SELECT traj_id, status FROM trajectories WHERE run_id = ?", [run_id]
        ).iter_rows()
    }
    with recorded_run(wh, run_id, "collect", dataclasses.asdict(cfg), cfg.run_name):
        stats, wstats, jobs = await _collect(
            wh, cfg, run_id, tasks, policy, done, on_progress, server, browser
        )
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
) -> tuple[Stats, Any, list[Job]]:
    """Start the sites when needed (unless given), run the engine over what is not stored yet,
    write. Nothing to run: no server, no browser, no writer."""
    pending = [
        t
        for t in tasks
        if any(
            done.get(traj_id_for(run_id, t.task_id, k)) in (None, INFRA_ERROR)
            for k in range(cfg.samples)
        )
    ]
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
            engine = Engine(
                run_id,
                policy,
                bundled_grader(server, client),
                writer.put,
                config=engine_cfg,
                env_config=env_cfg,
                on_progress=on_progress,
                env_factory=(lambda: BrowserEnv(shared, env_cfg)) if shared else None,
            )
            try:
                stats = await engine.run(jobs)
            finally:
                wstats = await writer.close()
    finally:
        if own_server and server is not None:
            server.stop()
        if hasattr(policy, "aclose"):
            await policy.aclose()
    return stats, wstats, jobs


@task(name="collect-rollouts")
def collect_rollouts(cfg: CollectConfig, home: str | None = None) -> dict[str, Any]:
    """Run the engine (library code) for the run; resumable, so Prefect retries are safe."""
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        return asyncio.run(run_collect(wh, cfg, prefect_env.progress_of("collect")))


@flow(name="collect")
def collect_flow(cfg: CollectConfig, home: str | None = None) -> dict[str, Any]:
    """Collect rollouts for ``cfg`` into the warehouse (recorded in ``runs``)."""
    return collect_rollouts(cfg, home)


def collect(
    cfg: CollectConfig, home: str | None = None, on_progress: Callable[[Stats], None] | None = None
) -> dict[str, Any]:
    """Run the collect flow; ``on_progress`` receives engine stats about once a second."""
    with prefect_env.progress_to("collect", on_progress):
        return collect_flow(cfg, home)
