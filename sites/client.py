"""Reading a site's server-side state for grading (the inspection endpoint, with the secret)."""

from __future__ import annotations

from typing import Any

import httpx

from sites.common import SECRET_HEADER, SID_COOKIE
from warehouse.retry import aretrying


class InspectionError(RuntimeError):
    """The inspection endpoint refused or failed."""


async def fetch_state(
    client: httpx.AsyncClient, origin: str, secret: str, session: str
) -> dict[str, Any]:
    """The site's state for a browser session (its ``wl_sid`` cookie).

    Transport errors (a connection the server just closed, a busy machine) are retried a few
    times (:mod:`warehouse.retry`): a grading hiccup must not turn a finished trajectory into an
    infrastructure error.
    """
    transport = aretrying(attempts=4, retry_on=httpx.TransportError, base_delay=0.2)
    try:
        r = await transport(
            client.get,
            f"{origin}/__webloop/state",
            params={"session": session},
            headers={SECRET_HEADER: secret},
            timeout=10,
        )
    except httpx.TransportError as exc:
        raise InspectionError(f"{origin}: inspection endpoint unreachable: {exc}") from exc
    if r.status_code != 200:
        raise InspectionError(f"{origin}: inspection endpoint answered {r.status_code}")
    return r.json()["state"]


def session_of(cookies: list[dict[str, Any]]) -> str | None:
    """The webloop session id among a browser context's cookies (Playwright's format)."""
    return next((c["value"] for c in cookies if c.get("name") == SID_COOKIE), None)
