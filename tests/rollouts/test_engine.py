"""The rollout engine in real Chromium against the bundled sites.

Episodes run as contexts of the session's Chromium (fixture ``chromium``), except the crash test:
it kills a browser, so the engine launches its own there (its default browser slots)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import signal

import httpx
import pytest

from rollouts.browser import SharedSlot
from rollouts.engine import Engine, EngineConfig, Finished, Outcome, make_jobs
from rollouts.env import BrowserEnv, EnvConfig, origin_of
from rollouts.policies import ExpertPolicy, PolicyContext
from sites.client import fetch_state, session_of
from sites.content import generate as content
from sites.tasks import TEMPLATES, resolve_start_url, task_from_spec
from stages.collect import bundled_grader
from tests.rollouts.engine_runner import Scripted, run_on_chromium

pytestmark = pytest.mark.browser


def tasks_of(template: str, n: int, seed: int = 0):
    c, out, seen = content(0), [], set()
    rng = random.Random(seed)
    while len(out) < n:
        spec = TEMPLATES[template](c, rng)
        if spec is None:
            continue
        t = task_from_spec(spec, site_seed=0, ood_site="travel")
        if t.task_id not in seen:
            seen.add(t.task_id)
            out.append(t)
    return out


def run_engine(
    server,
    tasks,
    policy,
    *,
    chromium=None,
    grader=None,
    samples=1,
    concurrency=3,
    engine_hook=None,
    **cfg,
):
    """The engine over ``tasks``: on contexts of ``chromium`` (the session's shared Chromium), or
    on browsers the engine launches itself (``chromium=None``)."""
    results: list[Finished] = []

    async def sink(done: Finished) -> None:
        results.append(done)

    def resolve(t):
        url = resolve_start_url(t.start_url, server.urls)
        return url, [origin_of(url)]

    env_cfg = EnvConfig(action_timeout_s=8)
    factory = None
    if chromium is not None:
        shared = SharedSlot(chromium.browser)
        factory = lambda: BrowserEnv(shared, env_cfg)  # noqa: E731

    async def main():
        async with httpx.AsyncClient() as client:
            engine = Engine(
                "test-run",
                policy,
                grader or bundled_grader(server, client),
                sink,
                config=EngineConfig(concurrency=concurrency, samples=samples, **cfg),
                env_config=env_cfg,
                env_factory=factory,
            )
            if engine_hook:
                engine_hook(engine)
            stats = await engine.run(make_jobs("test-run", tasks, samples, resolve))
            return stats, engine

    stats, engine = chromium.run(main()) if chromium is not None else asyncio.run(main())
    return {d.trajectory.traj_id: d for d in results}, stats, engine


def test_expert_rollouts_succeed_with_groups_and_full_step_records(server, chromium):
    tasks = tasks_of("shop_add_to_cart", 2) + tasks_of("wiki_twin_city", 1)
    done, stats, _ = run_engine(server, tasks, ExpertPolicy(), chromium=chromium, samples=2)
    assert len(done) == 6 and stats.by_status == {"success": 6}
    groups = {}
    for d in done.values():
        groups.setdefault(d.trajectory.group_id, []).append(d.trajectory.sample_idx)
    assert sorted(map(sorted, groups.values())) == [[0, 1]] * 3
    d = next(iter(done.values()))
    assert d.trajectory.n_steps == len(d.steps) > 0
    for s in d.steps:
        assert d.blobs[s.screenshot_hash].startswith(b"\x89PNG")
        assert b"[ref=" in d.blobs[s.a11y_hash]
        assert s.action_text and s.model_output.endswith(s.action_text)
    assert [s.step_idx for s in d.steps] == list(range(len(d.steps)))


def test_concurrent_rollouts_keep_their_state_apart(server, chromium):
    tasks = tasks_of("shop_add_to_cart", 4, seed=3)
    carts = {}

    async def grader(env, job, answer):
        origin = server.url("shop")
        sid = session_of(await env.cookies(origin))
        async with httpx.AsyncClient() as client:
            carts[job.task.task_id] = (sid, await fetch_state(client, origin, server.secret, sid))
        return Outcome("finished")

    run_engine(server, tasks, ExpertPolicy(), chromium=chromium, grader=grader, concurrency=4)
    assert len({sid for sid, _ in carts.values()}) == 4  # four sessions
    for t in tasks:
        cart = carts[t.task_id][1]["cart"]
        assert [i["pid"] for i in cart] == [t.checker["items"][0]["pid"]]  # only its own item


def test_the_allowlist_blocks_other_origins(server, chromium):
    task = tasks_of("wiki_on_page", 1)[0]
    other = server.url("mail") + "/folder/inbox"
    task = dataclasses.replace(task, reference=[f'goto("{other}")', *task.reference])
    done, _, _ = run_engine(server, [task], ExpertPolicy(), chromium=chromium)
    d = next(iter(done.values()))
    assert d.trajectory.status == "success", d.trajectory.error  # the episode went on
    assert other in d.trajectory.meta["blocked_requests"]
    assert d.steps[0].action_error  # the navigation failed: blocked by the client
    assert not d.trajectory.meta["final_url"].startswith(server.url("mail"))


class KillBrowserOnce(ExpertPolicy):
    """The expert, but at step 2 of the target trajectory it kills its own Chromium by pid."""

    def __init__(self, target_task: str) -> None:
        super().__init__()
        self.target, self.engine, self.killed = target_task, None, None
        self.jobs: dict[str, str] = {}  # traj_id -> task_id

    async def act(self, ctx: PolicyContext):
        if ctx.task_id == self.target and ctx.memory.get("cursor") == 2 and not self.killed:
            slot = next(s for tid, s in self.engine.active.items() if self.jobs[tid] == self.target)
            self.killed = await slot.pid()
            os.kill(self.killed, signal.SIGKILL)
            for _ in range(600):  # act only once Playwright has seen the browser go (≤ 60 s)
                if not slot.browser.is_connected():
                    break
                await asyncio.sleep(0.1)
            assert not slot.browser.is_connected(), "the killed browser still looks connected"
        return await super().act(ctx)


def test_a_killed_browser_fails_only_its_trajectory(server):
    tasks = tasks_of("mail_settings", 5)
    policy = KillBrowserOnce(tasks[0].task_id)

    def hook(engine):
        policy.engine = engine
        policy.jobs = {
            j.traj_id: j.task.task_id for j in make_jobs("test-run", tasks, 1, lambda t: ("", []))
        }

    done, _stats, engine = run_engine(server, tasks, policy, concurrency=2, engine_hook=hook)
    assert policy.killed
    by_task = {d.trajectory.task_id: d.trajectory for d in done.values()}
    assert by_task[tasks[0].task_id].status == "infra_error"
    assert "BrowserCrashed" in by_task[tasks[0].task_id].error
    assert all(by_task[t.task_id].status == "success" for t in tasks[1:])
    assert sum(s.launches for s in engine.slots) == 3  # the dead browser was relaunched


class SlowOnOne(ExpertPolicy):
    """The expert, but one task's trajectory stalls (a straggler)."""

    def __init__(self, slow_task: str) -> None:
        super().__init__()
        self.slow_task = slow_task

    async def act(self, ctx: PolicyContext):
        if ctx.task_id == self.slow_task:
            await asyncio.sleep(60)
        return await super().act(ctx)


def test_stragglers_are_cut_off_once_most_trajectories_finished(server, chromium):
    tasks = tasks_of("wiki_on_page", 4, seed=9)
    done, _stats, _ = run_engine(
        server,
        tasks,
        SlowOnOne(tasks[0].task_id),
        chromium=chromium,
        concurrency=4,
        straggler_fraction=0.75,
        straggler_grace_s=0.5,
    )
    by_task = {d.trajectory.task_id: d.trajectory for d in done.values()}
    assert by_task[tasks[0].task_id].status == "timeout"
    assert by_task[tasks[0].task_id].error == "straggler cut-off"
    assert all(by_task[t.task_id].status == "success" for t in tasks[1:])


def test_set_of_marks_and_normalized_coordinates(server, chromium):
    """A model-style episode: click by mark id, then by 0-1000 coordinates, then answer."""
    from rollouts.actions import parse_action

    async def main():
        slot = SharedSlot(chromium.browser)
        env = BrowserEnv(slot, EnvConfig(set_of_marks=True, coords="norm1000"))
        wiki = server.url("wiki")
        obs, _ = await env.reset(options={"start_url": wiki + "/", "max_steps": 5})
        assert obs.marks > 5
        mark = await env.page.evaluate(
            "() => document.querySelector('a[href^=\"/wiki/\"]').getAttribute('data-webloop-mark')"
        )
        obs, _, _, _, info = await env.step(parse_action(f"click([{mark}])"))
        assert info["error"] is None and "/wiki/" in obs.url
        box = await env.page.locator("#twin-link").bounding_box()
        x = (box["x"] + box["width"] / 2) / 1280 * 1000
        y = (box["y"] + box["height"] / 2) / 800 * 1000
        before = obs.url
        obs, _, _, _, info = await env.step(parse_action(f"click({x:.0f}, {y:.0f})"))
        assert obs.url != before and "/wiki/" in obs.url
        obs, _, term, _, info = await env.step(parse_action('answer("x")'))
        assert term and info["answer"] == "x"
        await env.close()
        await slot.close()

    chromium.run(main())


# -- scheduling (a simulated environment: no browser needed) ----------------------------------


def sim_tasks(lengths):
    from warehouse.records import Task

    return [
        Task(
            task_id=f"sim/{i}",
            suite="sim",
            instruction=f"task {i}",
            start_url=f"sim://{i}",
            difficulty=n,
            reference=['click(css="#next")'] * (n or 1),
        )
        for i, n in enumerate(lengths)
    ]


def sim_jobs(tasks):
    return make_jobs("sched", tasks, 1, lambda t: (t.start_url, []))


def run_sim(jobs, policy, concurrency, sink=None, **cfg):
    from rollouts.simenv import SimEnv

    async def grade(env, job, answer):
        return Outcome("success" if answer else "failure")

    async def keep(done):
        if sink:
            await sink(done)

    async def main():
        engine = Engine(
            "sched",
            policy,
            grade,
            keep,
            config=EngineConfig(concurrency=concurrency, **cfg),
            env_factory=lambda: SimEnv(lambda rng: 0.0, lambda rng: 0.0),
        )
        stats = await asyncio.wait_for(engine.run(jobs), 60)  # a guard against a hang only
        return engine, stats

    return asyncio.run(main())


def test_jobs_start_longest_expected_first():
    from rollouts.engine import order_jobs

    tasks = sim_tasks([2, 7, None, 7, 1, 4])
    tasks[2] = dataclasses.replace(tasks[2], reference=None)  # length unknown
    jobs = sim_jobs(tasks)
    ids = [j.task.task_id for j in order_jobs(jobs)]
    assert ids == ["sim/2", "sim/1", "sim/3", "sim/5", "sim/0", "sim/4"]  # unknown, then LPT
    assert order_jobs(jobs, "fifo") == jobs
    with pytest.raises(ValueError):
        order_jobs(jobs, "shortest_first")
    # the engine starts them in that order (one slot: a strict sequence)
    engine, stats = run_sim(jobs, ExpertPolicy(), 1)
    by_traj = {j.traj_id: j.task.task_id for j in jobs}
    assert [by_traj[t] for t in engine.started] == ids
    assert stats.by_status == {"success": 6}
    engine, _ = run_sim(jobs, ExpertPolicy(), 1, schedule="fifo")
    assert [by_traj[t] for t in engine.started] == [t.task_id for t in tasks]


class WaitForShort(ExpertPolicy):
    """The long task's first step waits until every short trajectory has been finished."""

    def __init__(self, long_task: str) -> None:
        super().__init__()
        self.long_task, self.shorts_done = long_task, asyncio.Event()

    async def act(self, ctx: PolicyContext):
        if ctx.task_id == self.long_task:
            await self.shorts_done.wait()
        return await super().act(ctx)


def test_a_free_slot_takes_the_next_job_while_others_still_run():
    """No batches, no per-step barrier: with 2 slots, all short trajectories run through one
    slot while the long one is blocked on the other (a batch loop would deadlock here)."""
    tasks = sim_tasks([9, 2, 3, 1, 2, 2])
    jobs = sim_jobs(tasks)
    policy = WaitForShort("sim/0")
    order: list[str] = []

    async def sink(done):
        order.append(done.trajectory.task_id)
        if len(order) == len(tasks) - 1:
            policy.shorts_done.set()

    _, stats = run_sim(jobs, policy, 2, sink=sink)
    assert stats.by_status == {"success": 6} and stats.steps == sum(
        n + 1 for n in [9, 2, 3, 1, 2, 2]
    )
    assert order[-1] == "sim/0" and sorted(order[:-1]) == [
        "sim/1",
        "sim/2",
        "sim/3",
        "sim/4",
        "sim/5",
    ]


def test_progress_per_step_and_text_only_observations(server, chromium):
    """record_progress grades after every step (the ``turn`` estimator's credit); an environment
    without screenshots stores none and still observes the accessibility tree."""
    task = tasks_of("shop_buy", 1, seed=5)[0]
    env_cfg = EnvConfig(action_timeout_s=8, screenshots=False)
    results = run_on_chromium(
        chromium, server, ExpertPolicy(), [task], env_cfg=env_cfg, record_progress=True
    )
    d = results[0]
    assert d.trajectory.status == "success"
    progress = d.trajectory.meta["progress"]
    assert len(progress) == len(d.steps) == d.trajectory.n_steps
    assert progress[-1] == 1.0
    assert progress == sorted(progress)  # the expert never undoes a criterion
    # the order checker's criteria are about the placed order: none is met before it is placed
    # (the click on "place order"), all are after it (the last step is the expert's answer)
    placed = progress.index(1.0)
    assert progress == [0.0] * placed + [1.0] * (len(progress) - placed)
    assert placed == len(progress) - 2, progress
    assert all(s.screenshot_hash is None and s.a11y_hash for s in d.steps)
    assert d.trajectory.meta["final_screenshot"] is None
    assert not any(v.startswith(b"\x89PNG") for v in d.blobs.values())


def test_scrolling_a_page_that_no_longer_changes_ends_as_a_repeated_action(server, chromium):
    """The untrained ranker's loop on a real page: ``scroll(down)`` leaves the accessibility tree
    as it was, so with ``max_repeats`` 3 the episode ends at its third scroll and is graded."""
    task = tasks_of("shop_buy", 1, seed=5)[0]
    env_cfg = EnvConfig(action_timeout_s=8, screenshots=False)
    scroll = Scripted(lambda i: "scroll(down)")
    (d,) = run_on_chromium(chromium, server, scroll, [task], env_cfg=env_cfg, max_repeats=3)
    assert [s.action_text for s in d.steps] == ["scroll(down)"] * 3
    assert d.trajectory.meta["ended_by"] == "repeated action"
    assert d.trajectory.status == "failure"
    assert len({s.a11y_hash for s in d.steps}) == 1  # the page did not change
    # a policy that navigates to new pages is not cut: the expert solves the same task
    (e,) = run_on_chromium(chromium, server, ExpertPolicy(), [task], env_cfg=env_cfg, max_repeats=2)
    assert e.trajectory.status == "success" and "ended_by" not in e.trajectory.meta
