"""Running the scripted expert over bundled tasks in real Chromium, and grading the result.

Used by the conformance tests, ``bench/sites.py`` and ``webloop sites check``. Each task gets a
fresh browser context (its own session, so its own server-side state); the final state comes from
the inspection endpoint and is graded by the task's programmatic checker
(:func:`stages.grading.grade`, the one grading function of collect, score-steps and this).
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import httpx

from rollouts.browser import launch
from rollouts.expert import run_reference
from sites.checkers import Verdict, check
from sites.server import SiteServer
from sites.tasks import resolve_start_url
from stages.grading import grade
from warehouse.records import Task


@dataclass
class ExpertResult:
    task_id: str
    site: str
    verdict: Verdict
    fresh_verdict: Verdict | None  # the checker on the start state (must fail)
    error: str | None
    start_status: int | None


async def run_expert_task(
    browser: Any,
    client: httpx.AsyncClient,
    server: SiteServer,
    task: Task,
    *,
    check_fresh: bool = False,
) -> ExpertResult:
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = await context.new_page()
        response = await page.goto(resolve_start_url(task.start_url, server.urls))
        status = response.status if response else None
        fresh = await grade(client, server, task, context.cookies, None) if check_fresh else None
        run = await run_reference(page, list(task.reference or []))
        verdict = await grade(client, server, task, context.cookies, run.answer)
        return ExpertResult(task.task_id, task.site or "", verdict, fresh, run.error, status)
    finally:
        await context.close()


async def run_expert(
    tasks: list[Task],
    server: SiteServer,
    *,
    concurrency: int = 4,
    check_fresh: bool = False,
    progress: Any = None,
    browser: Any = None,
) -> list[ExpertResult]:
    """Run the expert on every task with ``concurrency`` browser contexts at once, on
    ``browser`` (a launched Playwright Chromium of this event loop, left open) or on a Chromium
    launched and closed here."""
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(httpx.AsyncClient())
        if browser is None:
            from playwright.async_api import async_playwright

            pw = await stack.enter_async_context(async_playwright())
            browser = await launch(pw)
            stack.push_async_callback(browser.close)
        sem = asyncio.Semaphore(concurrency)

        async def one(task: Task) -> ExpertResult:
            async with sem:
                try:
                    res = await run_expert_task(
                        browser, client, server, task, check_fresh=check_fresh
                    )
                except Exception as exc:  # a crash is a result too, not a lost task
                    res = ExpertResult(
                        task.task_id,
                        task.site or "",
                        check(None, {}),
                        None,
                        f"{type(exc).__name__}: {exc}",
                        None,
                    )
                if progress:
                    progress(res)
                return res

        return await asyncio.gather(*(one(t) for t in tasks))
