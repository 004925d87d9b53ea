"""Grading on the bundled sites: the one function behind the scripted expert's checks
(``stages.bundled``), the collect engine's outcomes (``stages.collect``) and the exact PRM scorer
(``stages.score_steps``).

A browser session's cookies → its server-side state (inspection endpoint) → the task's
programmatic checker (:func:`sites.grading.grade_session`). Grading needs the sites' server and
secret, so it lives here: only ``flows`` imports ``sites`` beside ``rollouts``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from rollouts.engine import Job, Outcome
from sites.checkers import Verdict
from sites.grading import Cookies, grade_session
from sites.server import SiteServer
from sites.tasks import BUNDLED_SCHEME


def gradable(server: SiteServer | None, task: Any) -> bool:
    """Whether ``task`` can be graded programmatically here: a bundled task and running sites."""
    return server is not None and str(task.start_url).startswith(BUNDLED_SCHEME)


async def grade(
    client: httpx.AsyncClient,
    server: SiteServer,
    task: Any,
    cookies: Cookies,
    answer: str | None,
) -> Verdict:
    """THE grading function: the checker's verdict on the session whose cookies
    ``cookies(origin)`` returns (a Playwright ``context.cookies`` or ``BrowserEnv.cookies``)."""
    return await grade_session(client, server, task, cookies, answer)


def engine_grader(
    server: SiteServer | None, client: httpx.AsyncClient
) -> Callable[[Any, Job, str | None], Awaitable[Outcome]]:
    """The collect engine's grader: success/failure with the checker's criteria for bundled
    tasks; other tasks end ``finished`` (a judge decides later)."""

    async def outcome(env: Any, job: Job, answer: str | None) -> Outcome:
        if not gradable(server, job.task):
            return Outcome("finished")
        verdict = await grade(client, server, job.task, env.cookies, answer)
        status = "success" if verdict.success else "failure"
        return Outcome(status, {"criteria": verdict.to_dict()["criteria"]})

    return outcome


def criteria_grader(
    server: SiteServer, client: httpx.AsyncClient
) -> Callable[[Any, Any, str | None], Awaitable[list[dict[str, Any]]]]:
    """The exact PRM scorer's grade: the checker's criteria on a replayed session's state."""

    async def criteria(env: Any, task: Any, answer: str | None) -> list[dict[str, Any]]:
        verdict = await grade(client, server, task, env.cookies, answer)
        return verdict.to_dict()["criteria"]

    return criteria
