"""The asynchronous rollout engine.

Every trajectory advances on its own (no lock-step batches, no per-step barrier): ``concurrency``
workers each own a browser slot and take the next (task, sample) job the moment their trajectory
ends. Jobs start longest-expected first (``schedule``): the expected length is the task's
``difficulty`` or its reference solution's length, so long trajectories do not start last and
finish alone (the tail of a run); jobs of unknown length keep their order, ahead of the known ones.
Finished trajectories go to a background :class:`~rollouts.writer.BatchWriter`; the step loop
never waits on storage.

``env_factory`` replaces the browser with any object with :class:`~rollouts.env.BrowserEnv`'s
interface (``reset``/``step``/``close``/``cookies``), e.g. :class:`rollouts.simenv.SimEnv` for
benchmarks of the scheduler alone.

Robustness: a crashed browser or a model server that keeps failing ends only the affected
trajectory, as ``infra_error``; a step or trajectory over its time budget ends as ``timeout``;
unparseable model output is an invalid step (after ``max_invalid`` in a row, the episode ends as
a failure). With ``max_repeats`` set, an episode whose policy takes the same action on the same
page that many times ends there (``meta.ended_by = "repeated action"``) and is graded as it stands:
a greedy policy that scrolls a page that no longer moves would otherwise spend the whole step
budget (the untrained ranker does, on every task). "The same page" is the URL, the screenshot and
the accessibility tree with Playwright's per-snapshot frame prefix of element refs removed
(``f3e12`` → ``e12``), so a reload of the same page counts as the same page. These stop rules are
pure functions in :mod:`rollouts.stop_rules`. Resuming a run skips trajectories already stored
(and redoes infrastructure errors).

:meth:`Engine.interrupt` (the collector calls it on Ctrl-C) stops the run at once: the episodes
in flight are not handed to the sink (their trajectory is not stored, so a resume runs them
again), nor is an infrastructure error that ends an episode after the interruption (the browser
and the sites get the terminal's Ctrl-C too); what finished before stays finished.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import random
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rollouts.actions import ParseError, check_bounds, format_action, to_dict
from rollouts.env import BrowserCrashed, BrowserEnv, BrowserSlot, EnvConfig, Observation
from rollouts.labeller import ReferenceLabeller
from rollouts.policies import Policy, PolicyContext, PolicyUnavailable
from rollouts.prompts import Turn, render
from rollouts.stop_rules import ANSWERED, after_action, after_invalid_action, repeat_key
from warehouse.blobs import sha256_hex
from warehouse.ids import make_id, stable_hash, traj_id_for
from warehouse.records import INFRA_ERROR, TIMEOUT, Step, Task, Trajectory, utcnow


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings (stored with every run)."""

    concurrency: int = field(default=8, metadata={"help": "Trajectories in flight."})
    samples: int = field(default=1, metadata={"help": "Samples per task (a GRPO group)."})
    max_steps: int = field(default=30, metadata={"help": "Step budget per trajectory."})
    step_timeout_s: float = field(default=120.0, metadata={"help": "Policy + action time."})
    trajectory_timeout_s: float = field(default=900.0, metadata={"help": "Whole episode."})
    max_invalid: int = field(default=3, metadata={"help": "Consecutive invalid actions."})
    max_repeats: int = field(
        default=0,
        metadata={"help": "End an episode at this many equal actions on one page (0 = never)."},
    )
    straggler_fraction: float = field(
        default=1.0, metadata={"help": "Cut stragglers once this fraction finished (1 = never)."}
    )
    straggler_grace_s: float = field(default=60.0, metadata={"help": "Then wait this long."})
    seed: int = field(default=0, metadata={"help": "Seeds each trajectory's policy RNG."})
    schedule: str = field(
        default="longest_first",
        metadata={"help": "Job order: longest_first (expected length, when known) or fifo."},
    )
    record_progress: bool = field(
        default=False,
        metadata={
            "help": "Grade after every step; the share of criteria met goes to meta.progress."
        },
    )
    label_reference: bool = field(
        default=False,
        metadata={
            "help": "Tasks with a reference solution: label each state on the reference's path "
            "with its next step, grounded on the live page (rollouts.labeller); the labels go to "
            "meta.reference_labels, the first state where the policy did otherwise to "
            "meta.first_error."
        },
    )


@dataclass
class Job:
    task: Task
    sample_idx: int
    traj_id: str
    group_id: str
    start_url: str
    allowed_origins: list[str] = field(default_factory=list)


def episode_seed(seed: int, traj_id: str) -> int:
    """The seed of a trajectory's environment (its pages' ``Math.random``): a function of the
    run's seed and the trajectory, so a re-run of a trajectory sees the same page randomness."""
    return int(stable_hash(seed, traj_id, "env")[:8], 16)


@dataclass
class Outcome:
    """What the grader decided: ``status`` (success/failure/finished) and details."""

    status: str
    meta: dict[str, Any] = field(default_factory=dict)


Grader = Callable[[BrowserEnv, Job, str | None], Awaitable[Outcome]]


@dataclass
class Finished:
    """A finished trajectory, ready for the writer."""

    trajectory: Trajectory
    steps: list[Step]
    blobs: dict[str, bytes]


@dataclass
class Stats:
    total: int = 0
    running: int = 0
    finished: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    interrupted: int = 0  # episodes dropped by Engine.interrupt (not stored: a resume redoes them)
    stopped: bool = False  # Engine.interrupt was called: the run did not get through its jobs
    started: float = field(default_factory=time.perf_counter)

    @property
    def steps_per_s(self) -> float:
        return self.steps / max(1e-9, time.perf_counter() - self.started)


@dataclass
class _Tally:
    """What an episode counts as it goes: unparseable actions in a row, times each (page,
    action) was taken, the requests the allowlist blocked, the progress after each step."""

    invalid_run: int = 0
    repeats: Counter[tuple[str | None, ...]] = field(default_factory=Counter)
    blocked: list[Any] = field(default_factory=list)
    progress: list[float] = field(default_factory=list)


def make_jobs(
    run_id: str, tasks: list[Task], samples: int, resolve: Callable[[Task], tuple[str, list[str]]]
) -> list[Job]:
    """(task × sample) jobs with deterministic trajectory and group ids."""
    jobs = []
    for task in tasks:
        url, allowed = resolve(task)
        group = make_id("group", run_id, task.task_id, task.version)
        for k in range(samples):
            jobs.append(Job(task, k, traj_id_for(run_id, task.task_id, k), group, url, allowed))
    return jobs


SCHEDULES = ("longest_first", "fifo")


def expected_length(task: Task) -> int | None:
    """Expected steps of ``task``: its difficulty, else its reference length; None if unknown."""
    if isinstance(task.difficulty, int) and task.difficulty > 0:
        return task.difficulty
    if isinstance(task.reference, list | tuple) and task.reference:
        return len(task.reference)
    return None


def order_jobs(jobs: list[Job], schedule: str = "longest_first") -> list[Job]:
    """The order in which the engine starts ``jobs``. ``longest_first``: unknown lengths first
    (in their given order), then known lengths, longest first (stable: ties keep their order).
    With ``concurrency`` slots this is LPT list scheduling: the run ends on short trajectories."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; one of {SCHEDULES}")
    if schedule == "fifo":
        return list(jobs)
    unknown = [j for j in jobs if expected_length(j.task) is None]
    known = [j for j in jobs if expected_length(j.task) is not None]
    return unknown + sorted(known, key=lambda j: -(expected_length(j.task) or 0))


def _thought(text: str) -> str | None:
    m = re.search(r"thought\s*:\s*(.*?)(?:\n\s*action\s*:|$)", text, re.I | re.S)
    return m.group(1).strip() if m else None


class Engine:
    """Runs jobs with one policy, a grader and a sink for finished trajectories."""

    def __init__(
        self,
        run_id: str,
        policy: Policy,
        grader: Grader,
        sink: Callable[[Finished], Awaitable[None]],
        *,
        config: EngineConfig | None = None,
        env_config: EnvConfig | None = None,
        on_progress: Callable[[Stats], None] | None = None,
        env_factory: Callable[[], Any] | None = None,
    ) -> None:
        self.run_id, self.policy, self.grader, self.sink = run_id, policy, grader, sink
        self.config = config or EngineConfig()
        self.env_config = env_config or EnvConfig()
        self.on_progress = on_progress
        self.env_factory = env_factory
        self.stats = Stats()
        self.slots: list[BrowserSlot] = []
        self.active: dict[str, Any] = {}  # traj_id -> the slot (or simulated env) running it
        self.started: list[str] = []  # traj_ids in the order their episodes started
        self.interrupted = False  # interrupt() was called: nothing more starts or is stored
        self._workers: list[asyncio.Task] = []
        self._cutting = False  # the straggler cut-off is cancelling the workers

    def interrupt(self) -> None:
        """Stop the run now (Ctrl-C): no episode starts, the ones in flight are cancelled and
        not stored. Call it from the engine's event loop; :meth:`run` then returns its stats."""
        self.interrupted = self.stats.stopped = True
        for w in self._workers:
            w.cancel()

    async def run(self, jobs: list[Job]) -> Stats:
        self.stats = Stats(total=len(jobs), stopped=self.interrupted)
        self.started = []
        self._cutting = False
        queue: asyncio.Queue[Job] = asyncio.Queue()
        for job in order_jobs(jobs, self.config.schedule):
            queue.put_nowait(job)
        n = max(1, min(self.config.concurrency, len(jobs)))
        if self.env_factory is not None:
            await self._run_workers([self.env_factory() for _ in range(n)], queue)
        else:
            from playwright.async_api import async_playwright

            async with async_playwright() as pw:
                self.slots = [
                    BrowserSlot(pw, self.env_config.contexts_per_browser) for _ in range(n)
                ]
                try:
                    envs = [BrowserEnv(slot, self.env_config) for slot in self.slots]
                    await self._run_workers(envs, queue)
                finally:
                    for slot in self.slots:
                        await slot.close()
        self._report()
        return self.stats

    async def _run_workers(self, envs: list[Any], queue: asyncio.Queue[Job]) -> None:
        if self.interrupted:
            return
        workers = [asyncio.create_task(self._worker(env, queue)) for env in envs]
        self._workers = workers
        watcher = asyncio.create_task(self._watch(workers))
        try:
            await asyncio.gather(*workers, return_exceptions=True)
        finally:
            watcher.cancel()
            self._workers = []

    async def _watch(self, workers: list[asyncio.Task]) -> None:
        """Progress reports, and the straggler cut-off."""
        cut_at = None
        while True:
            await asyncio.sleep(1.0)
            self._report()
            frac = self.config.straggler_fraction
            if (
                cut_at is None
                and frac < 1.0
                and self.stats.total
                and self.stats.finished >= frac * self.stats.total
            ):
                cut_at = time.monotonic() + self.config.straggler_grace_s
            if cut_at is not None and time.monotonic() >= cut_at:
                self._cutting = True
                for w in workers:
                    w.cancel()
                return

    def _report(self) -> None:
        if self.on_progress:
            self.on_progress(self.stats)

    async def _worker(self, env: Any, queue: asyncio.Queue[Job]) -> None:
        """One slot: the next job starts as soon as the previous trajectory ended (no batch)."""
        while not self.interrupted:
            try:
                job = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            self.stats.running += 1
            self.active[job.traj_id] = getattr(env, "slot", env)
            self.started.append(job.traj_id)
            done: Finished | None = None
            try:
                done = await self._episode(env, job)
            except asyncio.CancelledError:
                if self._cutting and not self.interrupted:
                    await self._finish(self._aborted(job, TIMEOUT, "straggler cut-off", [], {}))
                else:  # interrupted (Ctrl-C, or the caller cancelled the run): not stored
                    self.stats.interrupted += 1
                raise
            finally:
                self.stats.running -= 1
                self.active.pop(job.traj_id, None)
                try:
                    await env.close()
                finally:  # an episode that ended is handed on, even if cancelled while closing
                    if done is not None:
                        await self._finish(done)

    async def _finish(self, done: Finished) -> None:
        st = done.trajectory.status
        if self.interrupted and st == INFRA_ERROR:
            # most likely the interruption itself (the browser got the Ctrl-C): not stored
            self.stats.interrupted += 1
            return
        self.stats.finished += 1
        self.stats.by_status[st] = self.stats.by_status.get(st, 0) + 1
        await self.sink(done)

    async def _episode(self, env: BrowserEnv, job: Job) -> Finished:
        steps: list[Step] = []
        blobs: dict[str, bytes] = {}
        meta: dict[str, Any] = {}
        try:
            return await asyncio.wait_for(
                self._play(env, job, steps, blobs, meta), self.config.trajectory_timeout_s
            )
        except TimeoutError:
            return self._aborted(job, TIMEOUT, "trajectory time budget spent", steps, blobs)
        except (BrowserCrashed, PolicyUnavailable) as exc:
            return self._aborted(job, INFRA_ERROR, f"{type(exc).__name__}: {exc}", steps, blobs)
        except Exception as exc:  # never lose the engine to one trajectory
            return self._aborted(job, INFRA_ERROR, f"{type(exc).__name__}: {exc}", steps, blobs)

    async def _play(
        self,
        env: BrowserEnv,
        job: Job,
        steps: list[Step],
        blobs: dict[str, bytes],
        meta: dict[str, Any],
    ) -> Finished:
        """The episode: observe, act, until a stop rule (:mod:`rollouts.stop_rules`) ends it;
        then grade it. A policy over its step timeout aborts it as ``timeout``."""
        started = utcnow()
        obs, _ = await env.reset(
            seed=episode_seed(self.config.seed, job.traj_id),
            options={
                "start_url": job.start_url,
                "allowed_origins": job.allowed_origins,
                "max_steps": self.config.max_steps,
            },
        )
        turns: list[Turn] = []
        ctx = self._policy_context(env, job, turns)
        labeller = self._labeller(env, job, turns)
        tally = _Tally()
        answer, stop = None, None
        while stop is None:
            turns.append(Turn(obs.url, obs.title, obs.screenshot, obs.a11y))
            t0 = time.perf_counter()
            try:
                out = await asyncio.wait_for(self.policy.act(ctx), self.config.step_timeout_s)
            except TimeoutError:
                return self._aborted(
                    job, TIMEOUT, "the policy exceeded the step timeout", steps, blobs
                )
            t_model = time.perf_counter() - t0
            action = out.action
            if not isinstance(action, ParseError):
                action = check_bounds(action, *self._screen(), text=out.text)
            step = self._step_row(job, obs, out, action, blobs, t_model)
            if labeller is not None:
                await labeller.label(step.action_text)
            if isinstance(action, ParseError):
                stop = self._invalid_step(step, action, turns, steps, tally)
            else:
                obs, answer, stop = await self._run_action(
                    env, job, obs, step, action, turns, steps, tally
                )
            if labeller is not None:
                labeller.moved(obs.url, obs.a11y)
        if stop != ANSWERED:
            meta["ended_by"] = stop
        if labeller is not None:
            meta.update(labeller.meta(len(steps)))
        return await self._graded(env, job, obs, answer, steps, blobs, meta, started, tally)

    def _policy_context(self, env: Any, job: Job, turns: list[Turn]) -> PolicyContext:
        """What the policy is given: the task, the episode's turns (growing), a seeded RNG."""
        return PolicyContext(
            job.task.task_id,
            job.task.instruction,
            list(job.task.reference or []),
            turns,
            random.Random(stable_hash(self.config.seed, job.traj_id)),
            page=getattr(env, "page", None),  # the expert grounds its plan in it
            # (an environment without a config, like the simulated one, waits on no page)
            action_timeout_s=getattr(getattr(env, "config", None), "action_timeout_s", 10.0),
        )

    def _labeller(self, env: Any, job: Job, turns: list[Turn]) -> ReferenceLabeller | None:
        """The episode's reference labeller (``label_reference`` on, a task with a reference
        and a live page), else None."""
        page = getattr(env, "page", None)
        if not self.config.label_reference or not job.task.reference or page is None:
            return None
        return ReferenceLabeller(
            job.task.task_id,
            job.task.instruction,
            list(job.task.reference),
            turns,
            page,
            getattr(getattr(env, "config", None), "action_timeout_s", 10.0),
        )

    def _invalid_step(
        self,
        step: Step,
        action: ParseError,
        turns: list[Turn],
        steps: list[Step],
        tally: _Tally,
    ) -> str | None:
        """An unparseable action: stored, shown to the policy as invalid, nothing run; why the
        episode stops (None: it goes on)."""
        tally.invalid_run += 1
        turns[-1] = dataclasses.replace(
            turns[-1], action_text="(invalid action)", error=action.reason
        )
        steps.append(step)
        self.stats.steps += 1
        tally.progress.append(tally.progress[-1] if tally.progress else 0.0)
        return after_invalid_action(
            tally.invalid_run, len(steps), self.config.max_invalid, self.config.max_steps
        )

    async def _run_action(
        self,
        env: BrowserEnv,
        job: Job,
        obs: Observation,
        step: Step,
        action: Any,
        turns: list[Turn],
        steps: list[Step],
        tally: _Tally,
    ) -> tuple[Observation, str | None, str | None]:
        """A parsed action run in the environment: the next observation, the answer (None: no
        answer yet) and why the episode stops (None: it goes on)."""
        tally.invalid_run = 0
        here = repeat_key(obs, step) if self.config.max_repeats else None
        t1 = time.perf_counter()
        obs, _, terminated, truncated, info = await env.step(action)
        step = _with(
            step, latency_env_s=round(time.perf_counter() - t1, 4), action_error=info["error"]
        )
        steps.append(step)
        self.stats.steps += 1
        tally.blocked += info["blocked"]
        turns[-1] = dataclasses.replace(
            turns[-1], action_text=step.action_text, error=info["error"]
        )
        if self.config.record_progress:
            tally.progress.append(0.0 if terminated else await self._progress(env, job))
        times_here = 0
        if here is not None:  # max_repeats set
            tally.repeats[here] += 1
            times_here = tally.repeats[here]
        stop = after_action(terminated, truncated, times_here, self.config.max_repeats)
        return obs, info["answer"] if terminated else None, stop

    async def _graded(
        self,
        env: BrowserEnv,
        job: Job,
        obs: Observation,
        answer: str | None,
        steps: list[Step],
        blobs: dict[str, bytes],
        meta: dict[str, Any],
        started: dt.datetime,
        tally: _Tally,
    ) -> Finished:
        """The ended episode graded, with its final page, progress and blocked requests."""
        outcome = await self.grader(env, job, answer)
        if self.config.record_progress and steps:
            tally.progress[-1] = _share_met(outcome.meta)
            meta["progress"] = [round(p, 4) for p in tally.progress]
        shot = _keep(blobs, obs.screenshot)
        meta.update(outcome.meta, final_url=obs.url, final_screenshot=shot)
        if tally.blocked:
            meta["blocked_requests"] = tally.blocked[:50]
        return self._finished(job, outcome.status, answer, None, steps, blobs, meta, started)

    async def _progress(self, env: Any, job: Job) -> float:
        """The share of the task's criteria met now (no answer given yet)."""
        return _share_met((await self.grader(env, job, None)).meta)

    def _screen(self) -> tuple[float, float]:
        if self.env_config.coords == "norm1000":
            return 1000.0, 1000.0
        return float(self.env_config.viewport_width), float(self.env_config.viewport_height)

    def _step_row(
        self,
        job: Job,
        obs: Observation,
        out: Any,
        parsed: Any,
        blobs: dict[str, bytes],
        t_model: float,
    ) -> Step:
        shot = _keep(blobs, obs.screenshot)
        tree = prompt = None
        if obs.a11y is not None:
            data = obs.a11y.encode()
            tree = sha256_hex(data)
            blobs[tree] = data
        if out.messages is not None:
            data = render(out.messages).encode()
            prompt = sha256_hex(data)
            blobs[prompt] = data
        return Step(
            traj_id=job.traj_id,
            step_idx=0,
            url=obs.url,
            title=obs.title,
            screenshot_hash=shot,
            a11y_hash=tree,
            prompt_hash=prompt,
            model_output=out.text,
            thought=_thought(out.text),
            action=None if isinstance(parsed, ParseError) else to_dict(parsed),
            action_text=None if isinstance(parsed, ParseError) else format_action(parsed),
            action_error=parsed.reason if isinstance(parsed, ParseError) else None,
            logprob=out.logprob,
            latency_model_s=round(t_model, 4),
            token_ids=_listed(getattr(out, "token_ids", None)),
            image_spans=_listed(getattr(out, "image_spans", None)),
        )

    def _aborted(
        self, job: Job, status: str, error: str, steps: list[Step], blobs: dict[str, bytes]
    ) -> Finished:
        return self._finished(job, status, None, error, steps, blobs, {}, None)

    def _finished(
        self,
        job: Job,
        status: str,
        answer: str | None,
        error: str | None,
        steps: list[Step],
        blobs: dict[str, bytes],
        meta: dict[str, Any],
        started: dt.datetime | None,
    ) -> Finished:
        ended = utcnow()
        rows = [_with(s, step_idx=i) for i, s in enumerate(steps)]
        traj = Trajectory(
            traj_id=job.traj_id,
            run_id=self.run_id,
            task_id=job.task.task_id,
            task_version=job.task.version,
            policy=self.policy.name,
            status=status,
            group_id=job.group_id,
            sample_idx=job.sample_idx,
            n_steps=len(rows),
            answer=answer,
            error=error,
            started_at=started,
            ended_at=ended,
            duration_s=round((ended - started).total_seconds(), 3) if started else None,
            meta=meta or None,
        )
        return Finished(traj, rows, blobs)


def _with(step: Step, **changes: Any) -> Step:
    return dataclasses.replace(step, **changes)


def _keep(blobs: dict[str, bytes], screenshot: bytes | None) -> str | None:
    """Store a screenshot among the trajectory's blobs; its hash (None: none captured)."""
    if screenshot is None:
        return None
    digest = sha256_hex(screenshot)
    blobs[digest] = screenshot
    return digest


def _share_met(meta: dict[str, Any]) -> float:
    """The share of a grader's criteria that passed (0 without criteria)."""
    crit = meta.get("criteria") or []
    return sum(bool(c.get("passed")) for c in crit) / len(crit) if crit else 0.0


def _listed(value: Any) -> Any:
    """Tuples (of tuples) as JSON-ready lists; None stays None."""
    if value is None:
        return None
    return [_listed(v) if isinstance(v, tuple | list) else v for v in value]
