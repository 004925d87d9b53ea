"""Who may use a dashboard, and who is labelling: an access token, as notebook servers do it.

``webloop dashboard`` starts Streamlit with ``WEBLOOP_DASHBOARD_TOKEN`` set (a random token, or
the one the environment gives) and prints the URL with ``?token=…``; a browser session that does
not present it sees a refusal and no data. On a shared machine, a port on 127.0.0.1 is open to
every local user; the token keeps the warehouse and its labels to whoever has the URL.

The reviewer of a label defaults to ``WEBLOOP_REVIEWER`` (``webloop dashboard`` sets it to the OS
user who started it), so labels say who made them without anyone typing a name.
"""

from __future__ import annotations

import getpass
import hmac
import os

TOKEN_ENV = "WEBLOOP_DASHBOARD_TOKEN"
REVIEWER_ENV = "WEBLOOP_REVIEWER"


def expected_token() -> str | None:
    """The token this dashboard requires (None: open, e.g. ``webloop dashboard --no-auth``)."""
    return os.environ.get(TOKEN_ENV) or None


def token_ok(expected: str | None, given: object) -> bool:
    """True when no token is required or ``given`` (a query parameter) is the token; compared
    in constant time."""
    if expected is None:
        return True
    if isinstance(given, list):  # a repeated ?token= parameter
        given = given[-1] if given else None
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


def default_reviewer() -> str:
    """``WEBLOOP_REVIEWER``, else the OS user running the dashboard ("" if unknown)."""
    named = os.environ.get(REVIEWER_ENV, "").strip()
    if named:
        return named
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
        return ""
