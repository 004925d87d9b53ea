"""Running the scripted expert over bundled tasks in real Chromium, and grading the result.

Used by the conformance tests, ``bench/sites.py`` and ``webloop sites check``. Each task gets a
fresh browser context (its own session, so its own server-side state); the final state comes from
the inspection endpoint and is graded by the task's programmatic checker.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx

from rollouts.browser import launch
from rollouts.expert import run_reference
from sites.checkers import Verdict, check
from sites.client import fetch_state, session_of
from sites.server import SiteServer
from sites.tasks import resolve_start_url
from warehouse.records import Task


@dataclass
class ExpertResult:
    task_id: str
    site: str
    verdict: Verdict
    fresh_verdict: Verdict | None  # the checker on the start state (must fail)
    error: str | None
    start_status: int | None


async def grade(
    client: httpx.AsyncClient, server: SiteServer, context: Any, task: Task, answer: str | None
) -> Verdict:
    origin = server.url(task.site or "")
    sid = session_of(await context.cookies(origin))
    state = await fetch_state(client, origin, server.secret, sid) if sid else {}
    return check(task.checker, state, answer)


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
        fresh = await grade(client, server, context, task, None) if check_fresh else None
        run = await run_reference(page, list(task.reference or []))
        verdict = await grade(client, server, context, task, run.answer)
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
) -> list[ExpertResult]:
    """Run the expert on every task with ``concurrency`` browser contexts at once."""
    from playwright.async_api import async_playwright

    sem = asyncio.Semaphore(concurrency)
    async with async_playwright() as pw, httpx.AsyncClient() as client:
        browser = await launch(pw)

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

        try:
            return await asyncio.gather(*(one(t) for t in tasks))
        finally:
            await browser.close()
