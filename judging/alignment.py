"""Step alignment by page state: where a trajectory stands on its task's reference path.

Matching action text only works for trajectories that emit the reference's own actions; a model
(and the expert, which records model-facing ``click(e12)`` / ``click(640, 212)`` actions) never
does. Instead the reference solution is replayed once per task and the page state after each of
its steps recorded (:class:`ReferencePaths`); a trajectory's prefix is replayed the same way and
each reached state is matched against that path (:func:`align`).

A page state (:class:`PageState`) is the URL (path and query; the server's host and port are not
part of it), the site's server-side state (from the inspection endpoint, through ``probe`` —
``judging`` must not import the sites, so the caller passes it, like the exact scorer's
``grade``), the names of the cookies set (a dismissed cookie banner) and the accessibility
snapshot with refs, focus and cursor marks removed (typed-but-unsubmitted fields, an open modal,
a chosen option). Scrolling changes none of it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from rollouts.actions import ParseError, parse_action
from rollouts.expert import reference_states

Probe = Callable[[Any, Any], Awaitable[Any]]  # (env, task) → the site's state (JSON-able)
Resolve = Callable[[Any], tuple[str, list[str]]]  # task → (start URL, allowed origins)

_VOLATILE = re.compile(r" \[(?:ref=(?:f\d+)?e\d+|active|cursor=[\w-]+)\]")


@dataclass(frozen=True)
class PageState:
    """A fingerprint of what the page and the site are in; equal states compare equal."""

    url: str
    site: str  # digest of the site's state ("" without a probe)
    page: str  # digest of the accessibility snapshot (volatile marks removed) and cookie names


def _digest(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _url_key(url: str) -> str:
    p = urlsplit(url or "")
    return p.path + (f"?{p.query}" if p.query else "")


async def page_state(env: Any, task: Any, probe: Probe | None, a11y: str | None) -> PageState:
    """The state ``env`` (a :class:`~rollouts.env.BrowserEnv`) is in now; ``a11y`` is the
    observation's snapshot when the caller has one (else it is taken here)."""
    page = env.page
    if a11y is None:
        a11y = await page.aria_snapshot(mode="ai")
    names = sorted({c.get("name", "") for c in await env.context.cookies()})
    site = _digest(await probe(env, task)) if probe is not None else ""
    return PageState(_url_key(page.url), site, _digest([_VOLATILE.sub("", a11y or ""), names]))


def align(reached: Sequence[PageState], path: Sequence[PageState]) -> int:
    """How many reference steps the trajectory has done, from the states it reached (the start
    state, then one per executed action) and the reference path's states (``path[k]``: after k
    reference steps).

    The cursor moves forward to the first later path state the trajectory reaches, back to the
    latest earlier one when it returns to one (``back()``), and stays when the state did not
    change or matches no path state: a trajectory that diverged stands at its last matching
    state."""
    j = 0
    for state in reached:
        if j < len(path) and state == path[j]:
            continue
        later = [k for k in range(j + 1, len(path)) if path[k] == state]
        if later:
            j = later[0]
            continue
        earlier = [k for k in range(j) if path[k] == state]
        if earlier:
            j = earlier[-1]
    return j


class ReferencePaths:
    """The page states along each task's reference solution, recorded once per task (and task
    version) in a fresh context of the environment it is given."""

    def __init__(self, resolve: Resolve, probe: Probe | None = None) -> None:
        self.resolve, self.probe = resolve, probe
        self.paths: dict[tuple[str, Any], list[PageState]] = {}
        self.locks: dict[tuple[str, Any], asyncio.Lock] = {}

    async def path(self, env: Any, task: Any) -> list[PageState]:
        key = (task.task_id, getattr(task, "version", None))
        lock = self.locks.setdefault(key, asyncio.Lock())
        async with lock:
            if key not in self.paths:
                self.paths[key] = await self._record(env, task)
            return self.paths[key]

    async def _record(self, env: Any, task: Any) -> list[PageState]:
        """Replay the reference (:func:`rollouts.expert.reference_states`)."""

        async def state(env: Any, a11y: str | None) -> PageState:
            return await page_state(env, task, self.probe, a11y)

        return await reference_states(env, self.resolve(task), task.reference or [], state)


REPLAYED_FAILURE_TIMEOUT_S = 0.3
"""The timeout of a replayed action that failed when it was recorded. It fails again the same
way on the same page (an element that was not there is not there now); waiting the full action
timeout for it again only costs time — seconds per such step of every replayed prefix."""


def _replayed(actions: Sequence[str | None], failed: Sequence[bool]):
    """The stored actions to replay, parsed, each with its timeout (None: the env's own; an
    action that failed when recorded gets :data:`REPLAYED_FAILURE_TIMEOUT_S`). Empty texts (an
    invalid step changed nothing) are left out."""
    for i, text in enumerate(actions):
        if not text:
            continue
        action = parse_action(text)
        if isinstance(action, ParseError):
            raise ValueError(f"stored action does not parse: {text!r}")
        again = i < len(failed) and failed[i]
        yield action, REPLAYED_FAILURE_TIMEOUT_S if again else None


async def replay_states(
    env: Any,
    task: Any,
    actions: Sequence[str | None],
    resolve: Resolve,
    probe: Probe | None,
    failed: Sequence[bool] = (),
) -> tuple[list[PageState], bool]:
    """Replay stored action texts from the task's start in a fresh context of ``env``: the
    states reached (start state first) and whether an ``answer`` ended the replay. ``failed``:
    per action, whether it failed when recorded (then it gets
    :data:`REPLAYED_FAILURE_TIMEOUT_S`)."""
    url, allowed = resolve(task)
    obs, _ = await env.reset(
        options={"start_url": url, "allowed_origins": allowed, "max_steps": 10_000}
    )
    states = [await page_state(env, task, probe, obs.a11y)]
    for action, timeout_s in _replayed(actions, failed):
        obs, _, done, _, _ = await env.step(action, timeout_s=timeout_s)
        if done:
            return states, True
        states.append(await page_state(env, task, probe, obs.a11y))
    return states, False


async def replay_actions(
    env: Any,
    task: Any,
    actions: Sequence[str | None],
    resolve: Resolve,
    failed: Sequence[bool] = (),
    *,
    snapshots: bool = False,
) -> bool:
    """:func:`replay_states` without the states: reach where the actions lead (no observations,
    no probes, for a replay whose alignment is already known); whether an ``answer`` ended it.
    ``snapshots``: take the accessibility snapshot at every state as collection did, so that
    refs inside frames (``f2e5``: Playwright numbers frames as its snapshots first meet them)
    name the same elements as in the stored actions."""
    url, allowed = resolve(task)
    await env.reset(options={"start_url": url, "allowed_origins": allowed, "max_steps": 10_000})
    for action, timeout_s in _replayed(actions, failed):
        if snapshots:
            await env.page.aria_snapshot(mode="ai")
        done, _, _ = await env.act(action, timeout_s=timeout_s)
        if done:
            return True
    if snapshots:
        await env.page.aria_snapshot(mode="ai")
    return False


FRAME_REF = re.compile(r"\bf\d+e\d+\b")


def has_frame_refs(actions: Sequence[str | None]) -> bool:
    """Whether any action targets an element inside a frame by ref (see :func:`replay_actions`)."""
    return any(a and FRAME_REF.search(a) for a in actions)
