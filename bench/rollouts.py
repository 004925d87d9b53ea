"""Rollout engine benchmark. Prints, in one run:

1. browser-bound: the engine with the expert policy at concurrency 1/4/8/16 vs a bare
   Playwright loop doing the same actions + screenshots on the same pages with the same
   concurrency; steps/s of each and their ratio (engine efficiency; aim >= 0.85);
2. model-bound, browser arm: the async engine vs a naive lock-step batch loop (every step waits
   for the slowest reply of the batch, every batch for its longest trajectory), both driving
   Chromium on the bundled sites through the same OpenAI policy to a model server in a CHILD
   PROCESS that plays the reference solution after a log-normal delay;
3. model-bound, simulated arm: the same two loops and the same policy and model server, with the
   browser replaced by :class:`rollouts.simenv.SimEnv` (the browser times measured in 2, or a
   log-normal), at a scale where the tail matters less (>= 200 trajectories).

Like for like: both arms run the same jobs with the same concurrency, step budget, policy and
model server; the model's delay is a function of (seed, task, step), so each request of one arm
has the same delay as the same request of the other, and a simulated browser step likewise.
Each arm runs ``--repeats`` times (alternating); medians and ranges are printed, with the step
and model-call counts of both arms (they must be equal), the ideal for the same run (C / mean
trajectory duration, and a lock-step vs perfect-async simulation fed this run's measured
latencies and lengths) and the sigma of the model latency (configured and measured).

    python bench/rollouts.py [--quick] [--sections browser,model,sim] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parents[1]))

from bench.childserver import ChildServer
from rollouts.actions import ParseError, format_action, parse_action
from rollouts.engine import (
    Engine,
    EngineConfig,
    Finished,
    Job,
    Outcome,
    episode_seed,
    make_jobs,
)
from rollouts.env import BrowserEnv, BrowserSlot, EnvConfig, origin_of
from rollouts.policies import ExpertPolicy, OpenAIPolicy, PolicyContext
from rollouts.prompts import Turn
from rollouts.simenv import SimEnv, empirical, lognormal
from warehouse.ids import stable_hash


def load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def resolver(server):
    from sites.tasks import resolve_start_url

    def resolve(t):
        url = resolve_start_url(t.start_url, server.urls)
        return url, [origin_of(url)]

    return resolve


def sim_resolve(t):
    return f"sim://{t.task_id}", []


async def sim_grader(env: Any, job: Job, answer: str | None) -> Outcome:
    return Outcome("success" if answer else "failure")


@dataclass
class ArmRun:
    """One run of one arm: wall time, trajectories, steps (policy outputs), model calls."""

    elapsed: float
    trajectories: int
    steps: int
    calls: int = 0
    finished: list[Finished] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.trajectories / self.elapsed


# -- 1. browser-bound -----------------------------------------------------------------------------


async def run_engine(
    policy, grader, jobs, concurrency, max_steps, env_factory=None, schedule="longest_first"
) -> ArmRun:
    done: list[Finished] = []

    async def sink(d: Finished) -> None:
        done.append(d)

    engine = Engine(
        "bench",
        policy,
        grader,
        sink,
        config=EngineConfig(concurrency=concurrency, max_steps=max_steps, schedule=schedule),
        env_factory=env_factory,
    )
    start = time.perf_counter()
    stats = await engine.run(jobs)
    return ArmRun(time.perf_counter() - start, len(done), stats.steps, finished=done)


async def bare_loop(server, tasks, concurrency) -> tuple[float, int]:
    """Playwright alone: per task a fresh context, then each reference action + screenshot +
    accessibility snapshot, waiting for the page to load; ``concurrency`` at a time."""
    from playwright.async_api import async_playwright

    from rollouts.browser import launch
    from sites.tasks import resolve_start_url

    queue = list(tasks)
    steps = 0

    async def worker(browser):
        nonlocal steps
        while queue:
            task = queue.pop()
            ctx = await browser.new_context(viewport={"width": 1280, "height": 800})
            page = await ctx.new_page()
            await page.goto(resolve_start_url(task.start_url, server.urls))
            for text in task.reference:
                a = parse_action(text)
                sel = getattr(getattr(a, "target", None), "selector", None)
                kind = type(a).__name__
                if kind == "Click":
                    await page.locator(sel).first.click()
                elif kind == "Type":
                    await page.locator(sel).first.fill(a.text)
                elif kind == "Select":
                    await page.locator(sel).first.select_option(label=a.value)
                await page.wait_for_load_state()
                await page.screenshot()
                await page.aria_snapshot(mode="ai")
                steps += 1
            await ctx.close()

    async with async_playwright() as pw:
        start = time.perf_counter()  # like the engine, launching the browsers counts
        browsers = [await launch(pw) for _ in range(concurrency)]
        await asyncio.gather(*(worker(b) for b in browsers))
        elapsed = time.perf_counter() - start
        for b in browsers:
            await b.close()
    return elapsed, steps


async def browser_bound(server, args) -> None:
    from sites.tasks import generate
    from stages.collect import bundled_grader

    print(f"1. browser-bound: expert policy, engine vs bare Playwright loop ({load()})", flush=True)
    tasks = generate(args.tasks, seed=11)
    async with httpx.AsyncClient() as client:
        for c in args.browser_concurrency:
            sample = tasks[: max(c * 2, 8)] if c < 16 else tasks
            sample = sample[: args.tasks]
            jobs = make_jobs("bench", sample, 1, resolver(server))
            e = await run_engine(
                ExpertPolicy(), bundled_grader(server, client), jobs, c, args.max_steps
            )
            b_s, b_steps = await bare_loop(server, sample, c)
            e_rate, b_rate = e.steps / e.elapsed, b_steps / b_s
            print(
                f"   concurrency {c:2d}: engine {e_rate:5.1f} steps/s, bare {b_rate:5.1f} "
                f"steps/s, efficiency {e_rate / b_rate:.2f}",
                flush=True,
            )


# -- the model server (a child process) -----------------------------------------------------------


def previous_actions(text: str) -> int:
    """How many earlier actions the prompt lists (the lines under 'Previous actions:')."""
    m = re.search(r"^Previous actions:\n((?:\d+\. .*\n?)*)", text, re.M)
    return len(re.findall(r"^\d+\. ", m.group(1), re.M)) if m else 0


def latency_of(seed: int, instruction: str, step: int, median: float, sigma: float, cap: float):
    """The model's delay for this request: a function of (seed, task, step) only."""
    rng = random.Random(stable_hash("model", seed, instruction, step))
    return min(cap, rng.lognormvariate(math.log(median), sigma))


def serve(port: int, tasks_json: str, median: float, sigma: float, cap: float, seed: int) -> None:
    """The child: an OpenAI-protocol server that replies with the next reference action."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    by_instruction = json.loads(Path(tasks_json).read_text())
    counts = {"requests": 0}

    async def stats(request: Request) -> JSONResponse:
        return JSONResponse(counts)

    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        text = "".join(
            c.get("text", "") for c in body["messages"][-1]["content"] if c.get("type") == "text"
        )
        instruction = re.search(r"^Task: (.*)$", text, re.M).group(1)
        done = previous_actions(text)
        ref = by_instruction[instruction]
        action = ref[done] if done < len(ref) else 'answer("done")'  # like the expert policy
        counts["requests"] += 1
        await asyncio.sleep(latency_of(seed, instruction, done, median, sigma, cap))
        return JSONResponse(
            {
                "object": "chat.completion",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": f"Action: {action}"}}
                ],
            }
        )

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/stats", stats),
        ]
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


class ModelProcess(ChildServer):
    """The expert model server in a child process (like a real model server, not sharing the
    benchmark's interpreter); ``requests()`` reads its request counter."""

    def __init__(self, tasks, median: float, sigma: float, cap: float, seed: int = 0) -> None:
        tmp = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)  # noqa: SIM115
        json.dump({t.instruction: t.reference for t in tasks}, tmp)
        tmp.close()
        self.tasks_json = Path(tmp.name)
        super().__init__(
            __file__,
            *("--tasks-json", tmp.name, "--latency-median", str(median)),
            *("--latency-sigma", str(sigma), "--latency-cap", str(cap)),
            *("--latency-seed", str(seed)),
        )

    def requests(self) -> int:
        return self.stats()["requests"]

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.tasks_json.unlink(missing_ok=True)


# -- the lock-step baseline -----------------------------------------------------------------------


async def lockstep(envs, jobs: list[Job], policy, grader, max_steps: int, seed: int = 0) -> ArmRun:
    """The naive loop: batches of ``len(envs)`` trajectories (in the given job order) advance in
    lock-step: each step waits for every reply of the batch, then for every action, and the next
    batch starts when the batch's longest trajectory ended. Per trajectory it does what the
    engine does: reset, policy call, action, until answer or the step budget (an unparseable
    reply is an invalid step, 3 in a row end the episode), then the grader."""
    batch = len(envs)
    steps = finished = 0
    start = time.perf_counter()
    for i in range(0, len(jobs), batch):
        group = jobs[i : i + batch]
        obs = [
            ob
            for ob, _ in await asyncio.gather(
                *(
                    env.reset(
                        seed=episode_seed(seed, j.traj_id),
                        options={
                            "start_url": j.start_url,
                            "allowed_origins": j.allowed_origins,
                            "max_steps": max_steps,
                        },
                    )
                    for env, j in zip(envs, group, strict=False)
                )
            )
        ]
        ctxs = [
            PolicyContext(
                j.task.task_id,
                j.task.instruction,
                list(j.task.reference or []),
                [],
                random.Random(stable_hash(seed, j.traj_id)),
            )
            for j in group
        ]
        n_steps, invalid, answers = [0] * len(group), [0] * len(group), [None] * len(group)
        active = list(range(len(group)))
        while active:
            for k in active:
                o = obs[k]
                ctxs[k].turns.append(Turn(o.url, o.title, o.screenshot, o.a11y))
            outs = await asyncio.gather(*(policy.act(ctxs[k]) for k in active))  # wait for all
            acting = []
            for k, out in zip(active, outs, strict=True):
                n_steps[k] += 1
                steps += 1
                if isinstance(out.action, ParseError):
                    invalid[k] += 1
                    t = ctxs[k].turns[-1]
                    ctxs[k].turns[-1] = Turn(
                        t.url, t.title, t.screenshot, t.a11y, "(invalid action)", out.action.reason
                    )
                else:
                    invalid[k] = 0
                    acting.append((k, out.action))
            results = await asyncio.gather(*(envs[k].step(a) for k, a in acting))  # wait for all
            ended = {k for k in active if invalid[k] >= 3 or n_steps[k] >= max_steps}
            for (k, a), (ob, _, term, trunc, info) in zip(acting, results, strict=True):
                t = ctxs[k].turns[-1]
                ctxs[k].turns[-1] = Turn(
                    t.url, t.title, t.screenshot, t.a11y, format_action(a), info["error"]
                )
                obs[k] = ob
                if term:
                    answers[k] = info["answer"]
                if term or trunc:
                    ended.add(k)
            active = [k for k in active if k not in ended]
        await asyncio.gather(
            *(grader(envs[k], j, answers[k]) for k, j in enumerate(group))
        )  # grading waits for the batch too
        for env in envs:
            await env.close()
        finished += len(group)
    return ArmRun(time.perf_counter() - start, finished, steps)


async def lockstep_browser(jobs, policy, grader, batch: int, max_steps: int) -> ArmRun:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        slots = [BrowserSlot(pw) for _ in range(batch)]  # launched lazily, inside the timing
        try:
            return await lockstep(
                [BrowserEnv(s, EnvConfig()) for s in slots], jobs, policy, grader, max_steps
            )
        finally:
            for slot in slots:
                await slot.close()


# -- the ideal for the same run -------------------------------------------------------------------


def ideal(finished: list[Finished], jobs: list[Job], c: int) -> dict[str, float]:
    """From the async run's own records: the throughput of C always-busy slots (C / mean
    trajectory duration), and a simulation of a perfect async scheduler (longest first) and of
    the lock-step loop (per step: slowest reply + slowest action of the batch; per batch: its
    slowest reset + grading) fed the measured per-step latencies and lengths."""
    by_id = {d.trajectory.traj_id: d for d in finished}
    rows = []
    for j in jobs:
        d = by_id[j.traj_id]
        model = [s.latency_model_s or 0.0 for s in d.steps]
        env = [s.latency_env_s or 0.0 for s in d.steps]
        total = d.trajectory.duration_s or (sum(model) + sum(env))
        rows.append((model, env, max(0.0, total - sum(model) - sum(env)), total))
    mean_d = statistics.fmean(r[3] for r in rows)
    free = [0.0] * c
    for r in sorted(rows, key=lambda r: -r[3]):
        k = free.index(min(free))
        free[k] += r[3]
    async_makespan = max(free)
    ls = 0.0
    for i in range(0, len(rows), c):
        group = rows[i : i + c]
        ls += max(r[2] for r in group)
        for k in range(max(len(r[0]) for r in group)):
            ls += max((r[0][k] for r in group if k < len(r[0])), default=0.0)
            ls += max((r[1][k] for r in group if k < len(r[1])), default=0.0)
    lat = [s.latency_model_s for d in finished for s in d.steps if s.latency_model_s]
    return {
        "rate": c / mean_d,
        "mean_d": mean_d,
        "ratio": ls / async_makespan,
        "sigma": statistics.pstdev(math.log(x) for x in lat) if len(lat) > 1 else float("nan"),
        "median_lat": statistics.median(lat) if lat else float("nan"),
    }


def spread(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.3f} (min {min(xs):.3f}, max {max(xs):.3f})"


async def compare(name, args, model, jobs, make_envs, env_factory, grader, max_steps) -> dict:
    """Alternate async and lock-step runs; print medians, spread, counts, ideal and sigma."""
    c = args.concurrency
    a_runs: list[ArmRun] = []
    l_runs: list[ArmRun] = []
    print(f"   {len(jobs)} trajectories, concurrency {c}, max_steps {max_steps}, ({load()})")
    for _ in range(args.repeats):
        for arm in ("async", "lock-step"):
            pol = OpenAIPolicy(model.url, "expert-model", timeout_s=60, retries=2)
            before = model.requests()
            if arm == "async":
                r = await run_engine(pol, grader, jobs, c, max_steps, env_factory)
                a_runs.append(r)
            else:
                r = await make_envs(pol)
                l_runs.append(r)
            r.calls = model.requests() - before
            await pol.aclose()
            print(
                f"     {arm:9s} {r.rate:6.3f} trajectories/s ({r.elapsed:6.1f} s, "
                f"{r.steps} steps, {r.calls} model calls)",
                flush=True,
            )
    a_rates, l_rates = [r.rate for r in a_runs], [r.rate for r in l_runs]
    ratios = [a.rate / b.rate for a, b in zip(a_runs, l_runs, strict=True)]
    ratio = statistics.median(a_rates) / statistics.median(l_rates)
    ids = [ideal(r.finished, jobs, c) for r in a_runs]
    ideal_rate = statistics.median(i["rate"] for i in ids)
    ideal_ratio = statistics.median(i["ratio"] for i in ids)
    sigma = statistics.median(i["sigma"] for i in ids)
    counts = (a_runs[0].steps, a_runs[0].calls, l_runs[0].steps, l_runs[0].calls)
    same = all((r.steps, r.calls) == counts[:2] for r in a_runs) and all(
        (r.steps, r.calls) == counts[2:] for r in l_runs
    )
    print(f"   {name}: async      {spread(a_rates)} trajectories/s")
    print(f"   {name}: lock-step  {spread(l_rates)} trajectories/s")
    print(
        f"   {name}: speed-up {ratio:.2f}x (ratio of medians; per pair {spread(ratios)}); "
        f"ideal for this run {ideal_ratio:.2f}x (lock-step vs perfect async, simulated on the "
        f"measured latencies and lengths)"
    )
    print(
        f"   {name}: async at {statistics.median(a_rates) / ideal_rate:.2f} of C / mean "
        f"trajectory duration ({ideal_rate:.3f} trajectories/s); model latency sigma "
        f"{args.latency_sigma:.2f} configured, {sigma:.2f} measured (median "
        f"{statistics.median(i['median_lat'] for i in ids):.3f} s, cap "
        f"{args.latency_cap * args.scale:.2f} s)"
    )
    print(
        f"   {name}: counts per run: async {counts[0]} steps, {counts[1]} model calls; "
        f"lock-step {counts[2]} steps, {counts[3]} model calls; "
        f"{'equal' if counts[:2] == counts[2:] and same else 'NOT EQUAL'}",
        flush=True,
    )
    env_lat = [s.latency_env_s for r in a_runs for d in r.finished for s in d.steps]
    overhead = [
        (d.trajectory.duration_s or 0.0)
        - sum((s.latency_model_s or 0) + (s.latency_env_s or 0) for s in d.steps)
        for r in a_runs
        for d in r.finished
    ]
    return {"env": [x for x in env_lat if x], "overhead": [max(0.0, x) for x in overhead]}


async def model_bound(server, args) -> dict:
    from sites.tasks import generate
    from stages.collect import bundled_grader

    print(
        f"2. model-bound, browser arm: log-normal model latency (child process), "
        f"async engine vs lock-step ({load()})",
        flush=True,
    )
    tasks = generate(args.model_tasks, seed=12)
    jobs = make_jobs("bench", tasks, 1, resolver(server))
    with ModelProcess(tasks, args.latency_median, args.latency_sigma, args.latency_cap) as model:
        async with httpx.AsyncClient() as client:
            grader = bundled_grader(server, client)

            async def run_lockstep(pol):
                return await lockstep_browser(jobs, pol, grader, args.concurrency, args.max_steps)

            args.scale = 1.0
            return await compare(
                "browser arm", args, model, jobs, run_lockstep, None, grader, args.max_steps
            )


async def simulated(args, measured: dict | None) -> None:
    from sites.tasks import generate

    s = args.sim_scale
    tasks = generate(args.sim_tasks, seed=13)
    jobs = make_jobs("bench", tasks, 1, sim_resolve)
    if measured and measured["env"] and measured["overhead"]:
        step_s = empirical([x * s for x in measured["env"]])
        reset_s = empirical([x * s for x in measured["overhead"]])
        source = (
            f"browser times measured in the browser arm ({len(measured['env'])} steps, median "
            f"{statistics.median(measured['env']):.3f} s; per-episode reset+grading median "
            f"{statistics.median(measured['overhead']):.3f} s)"
        )
    else:
        step_s, reset_s = lognormal(0.1 * s, 0.3), lognormal(0.3 * s, 0.2)
        source = "browser times log-normal (step median 0.1 s sigma 0.3, reset 0.3 s sigma 0.2)"
    print(f"3. model-bound, simulated arm: SimEnv, {source}, all times x{s} ({load()})", flush=True)
    args.scale = s
    with ModelProcess(
        tasks, args.latency_median * s, args.latency_sigma, args.latency_cap * s
    ) as model:

        async def run_lockstep(pol):
            envs = [SimEnv(step_s, reset_s) for _ in range(args.concurrency)]
            return await lockstep(envs, jobs, pol, sim_grader, args.max_steps)

        await compare(
            "simulated arm",
            args,
            model,
            jobs,
            run_lockstep,
            lambda: SimEnv(step_s, reset_s),
            sim_grader,
            args.max_steps,
        )


async def main_async(args) -> None:
    from sites.server import SiteServer

    sections = set(args.sections.split(","))
    measured = None
    print(
        f"webloop bench/rollouts.py: {os.cpu_count()} CPUs, repeats {args.repeats}, "
        f"model latency log-normal median {args.latency_median} s sigma {args.latency_sigma} "
        f"(cap {args.latency_cap} s), seed per (task, step)",
        flush=True,
    )
    if sections & {"browser", "model"}:
        with SiteServer(seed=0, mode="process") as server:
            if "browser" in sections:
                await browser_bound(server, args)
            if "model" in sections:
                measured = await model_bound(server, args)
    if "sim" in sections:
        await simulated(args, None if args.quick else measured)
    print(f"done ({load()})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, help="results file (default: bench/results/)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: seconds, every arm runs")
    ap.add_argument("--sections", default="browser,model,sim")
    ap.add_argument("--tasks", type=int, default=32, help="browser-bound section")
    ap.add_argument("--model-tasks", type=int, default=24, help="model-bound browser arm")
    ap.add_argument("--sim-tasks", type=int, default=240, help="model-bound simulated arm")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--latency-median", type=float, default=1.0, help="model reply, seconds")
    ap.add_argument("--latency-sigma", type=float, default=1.0, help="log-normal sigma")
    ap.add_argument("--latency-cap", type=float, default=10.0, help="longest reply, seconds")
    ap.add_argument("--latency-seed", type=int, default=0)
    ap.add_argument(
        "--sim-scale", type=float, default=0.1, help="simulated arm: every time scaled by this"
    )
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the child: serve on port
    ap.add_argument("--tasks-json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(
            args.serve,
            args.tasks_json,
            args.latency_median,
            args.latency_sigma,
            args.latency_cap,
            args.latency_seed,
        )
        return
    args.browser_concurrency = (1, 4, 8, 16)
    if args.quick:
        args.tasks, args.model_tasks, args.sim_tasks = 2, 3, 12
        args.concurrency, args.repeats, args.browser_concurrency = 2, 1, (1, 2)
        args.latency_median, args.sim_scale = 0.05, 0.1
    asyncio.run(main_async(args))


if __name__ == "__main__":
    from bench.results import run_main

    run_main("rollouts", main)
