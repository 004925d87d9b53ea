"""Grading a browser session on a bundled site: its session cookie → the server-side state
(inspection endpoint) → the task's programmatic checker.

The one implementation behind the scripted expert's checks (``stages.bundled``), the collect
engine's grader (``stages.collect``) and the exact PRM scorer (``stages.score_steps``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import httpx

from sites.checkers import check
from sites.client import fetch_state, session_of

if TYPE_CHECKING:
    from sites.checkers import Verdict
    from sites.server import SiteServer

Cookies = Callable[[str], Awaitable[list[dict[str, Any]]]]


async def grade_session(
    client: httpx.AsyncClient,
    server: SiteServer,
    task: Any,
    cookies: Cookies,
    answer: str | None,
) -> Verdict:
    """The checker's verdict on the state of the browser session whose cookies ``cookies(origin)``
    returns (a Playwright ``context.cookies`` or ``BrowserEnv.cookies``). ``task`` needs ``site``
    and ``checker``. A session that never reached the site is graded on an empty state."""
    origin = server.url(task.site or "")
    sid = session_of(await cookies(origin))
    state = await fetch_state(client, origin, server.secret, sid) if sid else {}
    return check(task.checker, state, answer)
