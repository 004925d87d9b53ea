"""The scripted expert: executes a task's reference solution action by action.

Reference solutions are lists of grammar strings (``click(css="#add-to-cart")``…). The expert
parses each with the shared parser and applies it with the shared executor, so whatever the
expert can do, the grammar and executor support. (The rollout engine adds noise injection and
records observations; this is the minimal executor loop.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rollouts.actions import Answer, ParseError, parse_action
from rollouts.browser import execute


@dataclass
class ExpertRun:
    """What happened: the final answer, each action's text, and the first error (if any)."""

    answer: str | None = None
    actions: list[str] = field(default_factory=list)
    error: str | None = None


async def run_reference(
    page: Any, reference: list[str], *, timeout_ms: float = 15_000
) -> ExpertRun:
    """Execute ``reference`` on ``page``; stop at the first action that fails."""
    run = ExpertRun()
    for i, text in enumerate(reference):
        action = parse_action(text)
        if isinstance(action, ParseError):
            run.error = f"step {i}: unparseable reference action {text!r}: {action.reason}"
            return run
        run.actions.append(text)
        result = await execute(page, action, timeout_ms=timeout_ms)
        if result.error:
            run.error = f"step {i} {text}: {result.error}"
            return run
        if isinstance(action, Answer):
            run.answer = result.answer
            return run
    return run


S = TypeVar("S")


async def reference_states(
    env: Any,
    start: tuple[str, list[str]],
    reference: Sequence[str],
    state: Callable[[Any, str | None], Awaitable[S]],
) -> list[S]:
    """The states along a reference solution: ``env`` (a rollout environment) is reset at
    ``start`` (URL, allowed origins) and the reference replayed action by action; ``state(env,
    a11y)`` is taken at the start and after each step, so ``path[k]`` is the state after k
    reference steps. Stops at the answer, an unparseable action, or the first step that fails on
    the page (the path then ends at the last state the reference reached). Page-state alignment
    (judging) and the intervention finder (curation) both measure against this path."""
    url, allowed = start
    obs, _ = await env.reset(
        options={"start_url": url, "allowed_origins": allowed, "max_steps": 10_000}
    )
    path = [await state(env, obs.a11y)]
    for text in reference:
        action = parse_action(text)
        if isinstance(action, ParseError | Answer):
            break
        obs, _, _, _, info = await env.step(action)
        if info["error"]:
            break
        path.append(await state(env, obs.a11y))
    return path
