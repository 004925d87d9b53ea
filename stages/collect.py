"""The ``collect`` stage: choose tasks, start the bundled sites when needed, run the rollout
engine with a policy, and record the run. The work is in ``rollouts`` (engine, writer) and
``sites`` (server, checkers); this module wires them together (no Prefect: ``flows.collect``
runs it as a flow).

The run id is derived from the configuration (or given with ``--run``), so re-running the same
command resumes the same run: stored trajectories are skipped, unfinished ones are redone.

One collector writes a run at a time: the run's lease (``warehouse.leases``) is held while it
runs; a second collector on the same run waits up to ``lease_wait_s`` and then refuses, naming
the holder. With ``workers`` or ``dask_address`` the tasks are sharded across Dask workers
(:mod:`flows.dask_scale`): the flow process holds the lease and records the run, each worker
runs its own sites server and browsers and writes its shard to the shared warehouse.

Start URLs are checked again before any browser work (:func:`vet_starts`): a task can reach the
warehouse without the import's check (write-mode SQL, a team catalog, ``warehouse copy``), so
each one goes through :func:`warehouse.urls.vet_start_url` — the import's policy, the running
bundled sites' own origins admitted, loopback and private hosts only with ``allow_private``. A
refused task is stored as an ``infra_error`` trajectory per sample, without steps, its ``error``
saying why (``meta.ended_by = "start URL refused"``); the other tasks run. A re-run with
``--allow-private`` (the same run: the option is operational) redoes them. ``allow_private`` also
lets the browser's proxy dial allowed names that resolve to loopback or private addresses
(:func:`rollouts.proxy.private_addresses_allowed`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from rollouts.browser import SharedSlot
from rollouts.engine import Engine, EngineConfig, Finished, Job, Stats, make_jobs
from rollouts.env import BrowserEnv, EnvConfig
from rollouts.policies import expert_action_space, make_policy
from rollouts.prompts import SYSTEM_PROMPTS, PromptConfig
from rollouts.proxy import private_addresses_allowed
from rollouts.writer import BatchWriter, WriterStats
from sites.server import SiteServer
from sites.tasks import BUNDLED_SCHEME, resolve_start_url
from stages.config import setting
from stages.grading import engine_grader
from stages.identity import Identity
from stages.runs import recorded_run
from stages.served import served_policy
from stages.shards import Session
from warehouse import Warehouse, WarehouseError
from warehouse.ids import run_id_for, stable_hash, traj_id_for
from warehouse.leases import Claim, hold
from warehouse.records import INFRA_ERROR, Task, Trajectory, utcnow
from warehouse.tasks import latest_tasks
from warehouse.urls import UrlRefused, WebUrl, vet_start_url

VOLATILE = ("concurrency", "run_name", "workers", "dask_address", "lease_wait_s", "allow_private")
REFUSED = "start URL refused"  # meta.ended_by of a task refused before any browser work


class CollectFailed(Exception):
    """Every episode of a collect run failed for infrastructure reasons (the CLI exits 1)."""


class CollectInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a collect run: what finished is stored, the episodes in flight are not
    (a re-run of the same command runs them). Its message is the one line the CLI prints."""


@dataclass(frozen=True)
class CollectResult:
    """What a collect run did (``skipped``: trajectories already stored; ``by_status``: the
    outcomes of those that ran; ``shards``/``workers``: when it ran on Dask)."""

    run_id: str
    tasks: int
    skipped: int
    ran: int
    by_status: dict[str, int]
    steps: int
    steps_per_s: float
    written: int
    transactions: int
    shards: int = 0
    workers: int = 0


@dataclass(frozen=True)
class CollectConfig:
    """What to collect: which tasks, which policy, how episodes run. Every field but the
    operational ones (concurrency, run name, Dask, lease wait) names the run, so the same
    settings resume the same run."""

    suite: str = setting("bundled", help="Task suite (bundled, om2w, webvoyager, rubric, …).")
    split: str | None = setting(
        "train", help="Split (train, test, ood; empty or null: every split)."
    )
    n_tasks: int = setting(50, help="Number of tasks.", min=1, max=1_000_000)
    samples: int = setting(1, help="Samples per task (a GRPO group).", min=1, max=1000)
    policy: str = setting(
        "expert", help="expert, random, openai, hf or ranker (hf/ranker: --model CHECKPOINT)."
    )
    noise: float = setting(0.0, help="Expert mistake rate (0 = flawless).", min=0.0, max=1.0)
    noise_kind: Literal["random", "habit"] = setting(
        "random",
        help="Expert mistakes: random (each step errs with probability --noise) or habit (that "
        "share of episodes has its template's one wrong habit: structured noise).",
    )
    base_url: str | None = setting(None, help="OpenAI-compatible endpoint (policy openai).")
    model: str | None = setting(None, help="Model name at the endpoint, or a checkpoint folder.")
    max_steps: int = setting(30, help="Step budget per trajectory.", min=1, max=1000)
    action_timeout_s: float = setting(
        10.0,
        help="Seconds an action waits for its element or page.",
        min=0.1,
        max=600.0,
        flag="--action-timeout",
    )
    seed: int = setting(0, help="Task order and policy RNG seed.", min=0, max=2**32 - 1)
    site_seed: int = setting(
        0, help="Seed of the bundled sites' content.", min=0, max=2**32 - 1, cli=False
    )
    allow_origins: tuple[str, ...] = setting(
        (), help="Extra origins the browser may reach (repeatable).", flag="--allow-origin"
    )
    allow_private: bool = setting(
        False,
        help="Admit start URLs on loopback and private hosts, and allowed names that resolve to "
        "such addresses (your own intranet or local sites); link-local and cloud-metadata "
        "addresses stay refused.",
    )
    coords: Literal["pixels", "norm1000"] = setting(
        "pixels", help="pixels or norm1000 (Qwen3-VL style)."
    )
    set_of_marks: bool = setting(False, help="Number interactive elements.")
    prompt_mode: Literal["screenshot", "a11y", "both"] = setting(
        "both", help="screenshot, a11y or both."
    )
    k_images: int = setting(3, help="Screenshots of the last k steps.", min=0, max=32)
    self_summary: bool = setting(False, help="Keep the model's own notes.")
    a11y_chars: int = setting(
        12_000, help="Cut the accessibility tree to this many characters.", min=100
    )
    a11y_focus: bool = setting(
        False, help="Cut it to whole lines around the focused element, not to its first ones."
    )
    system_prompt: Literal["full", "short"] = setting(
        "full",
        help="full: every action form; short: the accessibility-ref actions only, about 40% of "
        "the tokens (small models; not with --prompt-mode screenshot).",
    )
    inject_answer: bool = setting(
        False, help="Expert: append a prompt injection to every answer (judge robustness)."
    )
    screenshots: bool | None = setting(
        None, help="Capture screenshots (default: unless --prompt-mode a11y)."
    )
    temperature: float = setting(
        0.0, help="Model policies: sampling temperature (0 = greedy).", min=0.0, max=5.0
    )
    choose: Literal["generate", "candidates"] = setting(
        "generate",
        help="hf policy: act on the generated reply, or end its thought with the candidate "
        "action (the ranker's generator) the model finds most likely.",
    )
    concurrency: int = setting(
        8, help="Trajectories in flight (per Dask worker when sharded).", min=1, max=256
    )
    run_name: str | None = setting(None, help="Run name (default: from the config).", flag="--run")
    engine: dict[str, Any] = setting(
        factory=dict, help="Extra rollout-engine settings (EngineConfig fields).", cli=False
    )
    workers: int = setting(
        0,
        help="Shard across a local Dask cluster of N worker processes (0: no Dask).",
        min=0,
        max=1024,
    )
    dask_address: str | None = setting(
        None, help="Shard across an existing Dask cluster (tcp://HOST:8786)."
    )
    lease_wait_s: float = setting(
        0.0,
        help="Another collector writes this run: wait this long (s), then refuse.",
        min=0.0,
        max=86_400.0,
        flag="--lease-wait",
    )
    task_ids: tuple[str, ...] = setting(
        (),
        help="These tasks of the suite/split, in this order, instead of the first n_tasks of the "
        "seeded order (the RL loop's failures-first curriculum picks them).",
        cli=False,
    )

    def identity(self) -> dict[str, Any]:
        """What names the run (:data:`COLLECT_IDENTITY`, the one rule of
        :mod:`stages.identity`), and for the expert the action space it writes in."""
        d = COLLECT_IDENTITY.of(self)
        if self.policy == "expert":
            # the expert's actions are written in the model-facing space these options choose
            # (rollouts.grounding); a change of that space is another run, not a resume
            d["action_space"] = expert_action_space(self.prompt_mode, self.set_of_marks)
        return d


COLLECT_IDENTITY = Identity(
    excluded=VOLATILE,
    later=(
        "inject_answer",
        "action_timeout_s",
        "task_ids",
        "screenshots",
        "temperature",
        "noise_kind",
        "a11y_chars",
        "a11y_focus",
        "choose",
        "system_prompt",
    ),
)
"""How a collect run is named: every setting but the operational ones; the later ones only when
used."""


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
    if cfg.system_prompt not in SYSTEM_PROMPTS:
        raise WarehouseError(f"--system-prompt is one of {', '.join(SYSTEM_PROMPTS)}")
    if cfg.system_prompt == "short" and cfg.prompt_mode == "screenshot":
        raise WarehouseError(
            "--system-prompt short lists the accessibility-ref actions only; a screenshot-only "
            "prompt has no refs (use --system-prompt full)"
        )
    return PromptConfig(
        mode=cfg.prompt_mode,
        k_images=cfg.k_images,
        self_summary=cfg.self_summary,
        max_a11y_chars=cfg.a11y_chars,
        a11y_focus=cfg.a11y_focus,
        system=cfg.system_prompt,
    )


def make_policy_for(cfg: CollectConfig) -> Any:
    if cfg.choose != "generate" and cfg.policy != "hf":
        raise WarehouseError(
            f"--choose {cfg.choose} is for --policy hf (a VLM checkpoint), not {cfg.policy}"
        )
    if cfg.policy == "expert":
        return make_policy(
            "expert",
            noise=cfg.noise,
            noise_kind=cfg.noise_kind,
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
        return checkpoint_policy(
            cfg.policy, cfg.model, prompt_config(cfg), cfg.temperature, cfg.choose
        )
    return make_policy(cfg.policy)


def checkpoint_policy(
    name: str,
    model: str | None,
    prompt: PromptConfig,
    temperature: float,
    choose: str = "generate",
) -> Any:
    """A trained checkpoint folder as a rollout policy: ``hf`` (a VLM; ``choose``: see
    :class:`rollouts.hf.HFPolicy`) or ``ranker``."""
    import rollouts.hf  # (registers the policies)
    import rollouts.ranker  # noqa: F401

    if not model:
        raise WarehouseError(f"--policy {name} needs --model (a checkpoint folder)")
    if name == "hf" and choose == "generate":
        served = served_policy(model, prompt, temperature)  # RL: the run's served checkpoint
        if served is not None:
            return served
    options = {"choose": choose} if name == "hf" else {}
    return make_policy(name, model_path=model, prompt=prompt, temperature=temperature, **options)


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


# The engine's grader (stages.grading.engine_grader), under the name other modules import.
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


def vet_starts(
    tasks: list[Task], server: SiteServer | None, allow_private: bool
) -> tuple[dict[str, WebUrl], dict[str, str]]:
    """Each task's start URL as the browser will open it (a bundled one on ``server``), checked
    again with the import's policy (:func:`warehouse.urls.vet_start_url`; the running sites' own
    origins admitted): ``(task_id → URL, task_id → why it is refused)``."""
    urls = server.urls if server is not None else {}
    starts: dict[str, WebUrl] = {}
    refused: dict[str, str] = {}
    for t in tasks:
        try:
            url = resolve_start_url(t.start_url, urls) if server is not None else t.start_url
            starts[t.task_id] = vet_start_url(
                url, local_origins=urls.values(), allow_private=allow_private
            )
        except UrlRefused as exc:
            hint = "" if allow_private or not _private_only(url) else _PRIVATE_HINT
            refused[t.task_id] = f"{REFUSED}: {exc}{hint}"
    return starts, refused


_PRIVATE_HINT = " (--allow-private admits loopback and private hosts)"


def _private_only(url: str) -> bool:
    """Whether ``url`` is refused only for a loopback or private host (the opt-in admits it)."""
    try:
        vet_start_url(url, allow_private=True)
    except UrlRefused:
        return False
    return True


def refused_trajectory(run_id: str, policy: str, job: Job, reason: str) -> Finished:
    """The record of a job refused before any browser work: ``infra_error``, no steps (a
    re-run redoes it)."""
    now = utcnow()
    traj = Trajectory(
        traj_id=job.traj_id,
        run_id=run_id,
        task_id=job.task.task_id,
        task_version=job.task.version,
        policy=policy,
        status=INFRA_ERROR,
        group_id=job.group_id,
        sample_idx=job.sample_idx,
        error=reason,
        started_at=now,
        ended_at=now,
        duration_s=0.0,
        meta={"ended_by": REFUSED},
    )
    return Finished(traj, [], {})


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
) -> CollectResult:
    """Collect (or resume) the run described by ``cfg``.

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
    with _recorded(wh, cfg, run_id, "collect") as lease:
        done = stored_statuses(wh, run_id)  # read under the lease: no other writer now
        stats, wstats, jobs = await _collect(
            wh, cfg, run_id, tasks, policy, done, on_progress, server, browser, lease.check
        )
        if stats.stopped:
            raise CollectInterrupted(_interrupted_line(run_id, stats, wstats.trajectories))
        lease.check()
    return CollectResult(
        run_id=run_id,
        tasks=len(tasks),
        skipped=len(tasks) * cfg.samples - len(jobs),
        ran=len(jobs),
        by_status=dict(stats.by_status),
        steps=stats.steps,
        steps_per_s=round(stats.steps_per_s, 2),
        written=wstats.trajectories,
        transactions=wstats.transactions,
    )


@contextmanager
def _recorded(wh: Warehouse, cfg: CollectConfig, run_id: str, holder: str) -> Iterator[Any]:
    """The run's lease (one collector writes a run) and its ``runs`` row, around the work."""
    with (
        hold(
            wh,
            run_id,
            holder=holder,
            wait_s=cfg.lease_wait_s,
            on_wait=_lease_waiting(run_id, cfg.lease_wait_s),
        ) as lease,
        recorded_run(wh, run_id, "collect", dataclasses.asdict(cfg), cfg.run_name),
    ):
        yield lease


# -- on Dask: the flow process records the run and holds its lease, workers run shards ----------


@contextmanager
def sharded_session(wh: Warehouse, cfg: CollectConfig) -> Iterator[Session]:
    """The run's lease and record, and the pending task ids to shard (bad policy or browser
    options fail here, before any worker starts)."""
    run_id = run_id_for("collect", cfg.identity(), cfg.run_name)
    tasks = select_tasks(wh, cfg)
    make_policy_for(cfg)
    env_config(cfg)
    with _recorded(wh, cfg, run_id, "collect (dask)") as lease:
        pending = pending_tasks(tasks, run_id, cfg.samples, stored_statuses(wh, run_id))
        yield Session(run_id, [t.task_id for t in pending], total=len(tasks), fence=lease.check)


def run_shard(wh: Warehouse, cfg: CollectConfig, run_id: str, task_ids: list[str]) -> CollectResult:
    """One worker's share of a run: the given tasks, with its own sites server and browsers.
    Skips what is stored, so a rerun after a dead worker is safe."""
    wanted = set(task_ids)
    tasks = [t for t in select_tasks(wh, cfg) if t.task_id in wanted]
    done = stored_statuses(wh, run_id)
    stats, wstats, jobs = asyncio.run(
        _collect(wh, cfg, run_id, tasks, make_policy_for(cfg), done, None)
    )
    return CollectResult(
        run_id=run_id,
        tasks=len(tasks),
        skipped=0,
        ran=len(jobs),
        by_status=dict(stats.by_status),
        steps=stats.steps,
        steps_per_s=0.0,
        written=wstats.trajectories,
        transactions=wstats.transactions,
    )


def merge_shards(
    cfg: CollectConfig, session: Session, parts: list[CollectResult], workers: int
) -> CollectResult:
    """The run's result from its shards' results."""
    by_status: dict[str, int] = {}
    for part in parts:
        for status, n in part.by_status.items():
            by_status[status] = by_status.get(status, 0) + n
    ran = sum(p.ran for p in parts)
    return CollectResult(
        run_id=session.run_id,
        tasks=session.total,
        skipped=session.total * cfg.samples - ran,
        ran=ran,
        by_status=by_status,
        steps=sum(p.steps for p in parts),
        steps_per_s=0.0,
        written=sum(p.written for p in parts),
        transactions=sum(p.transactions for p in parts),
        shards=len(parts),
        workers=workers,
    )


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
        starts, refused = vet_starts(pending, server, cfg.allow_private)

        def resolve(t: Task) -> tuple[str, list[str]]:
            start = starts.get(t.task_id)
            if start is None:  # refused: never opened
                return t.start_url, []
            return start.href, [start.origin, *cfg.allow_origins]

        jobs = [
            j
            for j in make_jobs(run_id, pending, cfg.samples, resolve)
            if done.get(j.traj_id) in (None, INFRA_ERROR)
        ]
        _say_refused(refused)
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
                stats = await _run(engine, jobs, refused, put, cfg.allow_private)
            finally:
                undo()
                wstats = await writer.close()
    finally:
        if own_server and server is not None:
            server.stop()
        if hasattr(policy, "aclose"):
            await policy.aclose()
    return stats, wstats, jobs


async def _run(
    engine: Engine,
    jobs: list[Job],
    refused: dict[str, str],
    put: Callable[[Finished], Awaitable[None]],
    allow_private: bool,
) -> Stats:
    """Store the refused jobs' records (:func:`refused_trajectory`), run the others (none: no
    browser starts); the run's stats, the refused counted as infrastructure errors."""
    runnable = []
    for job in jobs:
        if job.task.task_id in refused:
            await put(
                refused_trajectory(
                    engine.run_id, engine.policy.name, job, refused[job.task.task_id]
                )
            )
        else:
            runnable.append(job)
    with private_addresses_allowed(allow_private):  # (the engine's tasks inherit it)
        stats = await engine.run(runnable) if runnable else Stats()
    n = len(jobs) - len(runnable)
    stats.total += n
    stats.finished += n
    if n:
        stats.by_status[INFRA_ERROR] = stats.by_status.get(INFRA_ERROR, 0) + n
    return stats


def _say_refused(refused: dict[str, str]) -> None:
    """One line per refused task on stderr (the first few; each is stored with its reason)."""
    for task_id, reason in list(refused.items())[:5]:
        print(f"task {task_id}: {reason}", file=sys.stderr)
    if len(refused) > 5:
        print(f"… and {len(refused) - 5} more tasks refused (trajectories.error)", file=sys.stderr)


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


def refuse_nothing_collected(wh: Warehouse, out: CollectResult) -> None:
    """:class:`CollectFailed` when every episode that ran ended in an infrastructure error (a
    model server that refuses the key, a browser that cannot start): nothing was collected, and
    the command must say so and fail, not report success."""
    if not out.ran or out.by_status.get(INFRA_ERROR, 0) != sum(out.by_status.values()):
        return
    first = wh.sql(
        "SELECT error FROM trajectories WHERE run_id = ? AND status = ? ORDER BY traj_id LIMIT 1",
        [out.run_id, INFRA_ERROR],
    )
    example = first.item() if first.height else None
    raise CollectFailed(
        f"all {out.ran} episodes of run {out.run_id} ended in an infrastructure error, "
        f"nothing was collected; e.g. {example}"
    )
