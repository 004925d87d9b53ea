"""Rollout engine benchmark. Prints, in one run:

1. browser-bound: the engine with the expert policy at concurrency 1/4/8/16 vs a bare
   Playwright loop doing the same actions + screenshots on the same pages with the same
   concurrency; steps/s of each and their ratio (engine efficiency; aim >= 0.85);
2. model-bound: against a local OpenAI-compatible server whose replies are correct (it plays the
   reference solution) but arrive with heavy-tailed latency (log-normal), the async engine vs a
   naive lock-step batch loop (every step waits for the slowest reply of the batch, every batch
   for its longest trajectory) at equal concurrency; trajectories/s of each and the speed-up
   (aim >= 4x).

    python bench/rollouts.py [--tasks 32] [--model-tasks 24] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import re
import sys
import time
from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).parents[1]))

from flows.collect import bundled_grader
from rollouts.actions import format_action, parse_action
from rollouts.browser import launch
from rollouts.engine import Engine, EngineConfig, Finished, make_jobs
from rollouts.env import BrowserEnv, BrowserSlot, EnvConfig, origin_of
from rollouts.localserver import ThreadedServer
from rollouts.policies import ExpertPolicy, OpenAIPolicy, PolicyContext
from rollouts.prompts import Turn
from sites.server import SiteServer
from sites.tasks import generate, resolve_start_url


def resolver(server: SiteServer):
    def resolve(t):
        url = resolve_start_url(t.start_url, server.urls)
        return url, [origin_of(url)]

    return resolve


async def run_engine(server, tasks, policy, concurrency) -> tuple[float, int, int]:
    done: list[Finished] = []

    async def sink(d: Finished) -> None:
        done.append(d)

    async with httpx.AsyncClient() as client:
        engine = Engine(
            "bench",
            policy,
            bundled_grader(server, client),
            sink,
            config=EngineConfig(concurrency=concurrency, max_steps=40),
        )
        start = time.perf_counter()
        stats = await engine.run(make_jobs("bench", tasks, 1, resolver(server)))
        elapsed = time.perf_counter() - start
    return elapsed, stats.steps, len(done)


async def bare_loop(server, tasks, concurrency) -> tuple[float, int]:
    """Playwright alone: per task a fresh context, then each reference action + screenshot +
    accessibility snapshot, waiting for the page to load; ``concurrency`` at a time."""
    from playwright.async_api import async_playwright

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


# -- model-bound ----------------------------------------------------------------------------------


class ExpertModelServer:
    """OpenAI-protocol server that replies with the next reference action after a heavy-tailed
    (log-normal) delay. The task is recognised from the prompt; progress from its history."""

    def __init__(self, tasks, median_s: float = 0.25, sigma: float = 1.0, seed: int = 0):
        self.by_instruction = {t.instruction: t.reference for t in tasks}
        self.rng = random.Random(seed)
        self.mu, self.sigma = math.log(median_s), sigma
        app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])
        self.http = ThreadedServer(app)
        self.url = self.http.base + "/v1"

    async def chat(self, request: Request):
        body = await request.json()
        text = "".join(
            c.get("text", "") for c in body["messages"][-1]["content"] if c.get("type") == "text"
        )
        instruction = re.search(r"^Task: (.*)$", text, re.M).group(1)
        done = len(re.findall(r"^\d+\. ", text, re.M))
        ref = self.by_instruction[instruction]
        action = ref[done] if done < len(ref) else 'answer("done")'  # like the expert policy
        await asyncio.sleep(min(10.0, self.rng.lognormvariate(self.mu, self.sigma)))
        return JSONResponse(
            {
                "object": "chat.completion",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": f"Action: {action}"}}
                ],
            }
        )

    def __enter__(self):
        self.http.__enter__()
        return self

    def __exit__(self, *exc):
        self.http.__exit__(*exc)


async def lockstep(server, tasks, policy, batch: int) -> tuple[float, int]:
    """The naive loop: batches of ``batch`` trajectories advance in lock-step."""
    from playwright.async_api import async_playwright

    finished = 0
    async with async_playwright() as pw:
        slots = [BrowserSlot(pw) for _ in range(batch)]
        envs = [BrowserEnv(s, EnvConfig()) for s in slots]
        start = time.perf_counter()
        for i in range(0, len(tasks), batch):
            group = tasks[i : i + batch]
            cur = list(
                await asyncio.gather(
                    *(
                        env.reset(resolve_start_url(t.start_url, server.urls))
                        for env, t in zip(envs, group, strict=False)
                    )
                )
            )
            history: list[list[Turn]] = [[] for _ in group]
            active = list(range(len(group)))
            for _ in range(40):
                if not active:
                    break
                ctxs = [
                    PolicyContext(
                        group[k].task_id,
                        group[k].instruction,
                        None,
                        [
                            *history[k],
                            Turn(cur[k].url, cur[k].title, cur[k].screenshot, cur[k].a11y),
                        ],
                        random.Random(0),
                    )
                    for k in active
                ]
                outs = await asyncio.gather(*(policy.act(c) for c in ctxs))  # wait for all
                results = await asyncio.gather(
                    *(envs[k].step(o.action) for k, o in zip(active, outs, strict=True))
                )
                still = []
                for k, o, (ob, term, trunc, _) in zip(active, outs, results, strict=True):
                    history[k].append(
                        Turn(cur[k].url, cur[k].title, None, None, format_action(o.action))
                    )
                    cur[k] = ob
                    if not (term or trunc):
                        still.append(k)
                active = still
            finished += len(group)
        elapsed = time.perf_counter() - start
        for env, slot in zip(envs, slots, strict=True):
            await env.close()
            await slot.close()
    return elapsed, finished


async def main_async(args) -> None:
    with SiteServer(seed=0, mode="process") as server:
        print("1. browser-bound: expert policy, engine vs bare Playwright loop", flush=True)
        tasks = generate(args.tasks, seed=11)
        for c in (1, 4, 8, 16):
            sample = tasks[: max(c * 2, 8)] if c < 16 else tasks
            e_s, e_steps, _ = await run_engine(server, sample, ExpertPolicy(), c)
            b_s, b_steps = await bare_loop(server, sample, c)
            e_rate, b_rate = e_steps / e_s, b_steps / b_s
            print(
                f"   concurrency {c:2d}: engine {e_rate:5.1f} steps/s, bare {b_rate:5.1f} "
                f"steps/s, efficiency {e_rate / b_rate:.2f}",
                flush=True,
            )
        print(
            "2. model-bound: heavy-tailed model latency, async engine vs lock-step batches",
            flush=True,
        )
        mtasks = generate(args.model_tasks, seed=12)
        c = args.concurrency
        with ExpertModelServer(mtasks, args.latency_median, args.latency_sigma) as fake:
            pol = OpenAIPolicy(fake.url, "expert-model", timeout_s=30, retries=2)
            a_s, _, a_n = await run_engine(server, mtasks, pol, c)
            l_s, l_n = await lockstep(server, mtasks, pol, c)
            await pol.aclose()
        print(
            f"   concurrency {c}: async {a_n / a_s:.2f} trajectories/s ({a_s:.0f} s), "
            f"lock-step {l_n / l_s:.2f} trajectories/s ({l_s:.0f} s), "
            f"speed-up {l_s / a_s:.1f}x",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--model-tasks", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--latency-median", type=float, default=1.0, help="model reply, seconds")
    ap.add_argument("--latency-sigma", type=float, default=1.0, help="log-normal sigma")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
