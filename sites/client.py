"""Reading a site's server-side state for grading (the inspection endpoint, with the secret)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from sites.common import SECRET_HEADER, SID_COOKIE


class InspectionError(RuntimeError):
    """The inspection endpoint refused or failed."""


async def fetch_state(
    client: httpx.AsyncClient, origin: str, secret: str, session: str
) -> dict[str, Any]:
    """The site's state for a browser session (its ``wl_sid`` cookie).

    Transport errors (a connection the server just closed, a busy machine) are retried a few
    times: a grading hiccup must not turn a finished trajectory into an infrastructure error.
    """
    for attempt in range(4):
        try:
            r = await client.get(
                f"{origin}/__webloop/state",
                params={"session": session},
                headers={SECRET_HEADER: secret},
                timeout=10,
            )
            break
        except httpx.TransportError as exc:
            if attempt == 3:
                raise InspectionError(f"{origin}: inspection endpoint unreachable: {exc}") from exc
            await asyncio.sleep(0.2 * 2**attempt)
    if r.status_code != 200:
        raise InspectionError(f"{origin}: inspection endpoint answered {r.status_code}")
    return r.json()["state"]


def session_of(cookies: list[dict[str, Any]]) -> str | None:
    """The webloop session id among a browser context's cookies (Playwright's format)."""
    return next((c["value"] for c in cookies if c.get("name") == SID_COOKIE), None)
