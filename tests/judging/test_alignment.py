"""Step alignment by page state: a trajectory of model-facing actions (refs, coordinates) stands
where its reached page state is on the reference path, and the exact scorer uses that."""

from __future__ import annotations

import random
from typing import Any

import httpx
import pytest

from judging.alignment import PageState, align
from judging.base import TrajectoryView
from judging.prm import ExactScorer, Proposal, State
from rollouts.actions import format_action, parse_action
from rollouts.browser import SharedSlot
from rollouts.env import BrowserEnv, EnvConfig, origin_of
from rollouts.grounding import ground
from rollouts.policies import ExpertPolicy, PolicyContext
from rollouts.prompts import Turn
from sites.client import fetch_state, session_of
from sites.tasks import generate, resolve_start_url
from warehouse.records import Step, Trajectory


def _s(name: str) -> PageState:
    return PageState(name, "", "")


def test_align_moves_forward_stays_goes_back_and_keeps_the_last_match():
    path = [_s("a"), _s("b"), _s("c"), _s("d")]
    assert align([_s("a"), _s("b"), _s("c")], path) == 2
    assert align([_s("a"), _s("b"), _s("b"), _s("c")], path) == 2  # a no-op step: stays
    assert align([_s("a"), _s("b"), _s("c"), _s("b")], path) == 1  # back()
    assert align([_s("a"), _s("b"), _s("x"), _s("y")], path) == 1  # diverged
    assert align([_s("a"), _s("x"), _s("c")], path) == 2  # came back onto the path
    assert align([_s("x")], path) == 0


def _task() -> Any:
    return next(t for t in generate(200, seed=3) if t.meta["template"] == "shop_add_to_cart")


def _resolve(server):
    def resolve(t: Any) -> tuple[str, list[str]]:
        url = resolve_start_url(t.start_url, server.urls)
        return url, [origin_of(url)]

    return resolve


async def _model_facing_prefix(browser, server, task, n: int, space: str) -> list[str]:
    """The expert's model-facing actions for the first ``n`` reference steps (scrolls that bring
    elements into view included), as a collected trajectory has them."""
    env = BrowserEnv(SharedSlot(browser))
    url, allowed = _resolve(server)(task)
    obs, _ = await env.reset(options={"start_url": url, "allowed_origins": allowed})
    turns: list[Turn] = []
    ctx = PolicyContext(
        task.task_id, task.instruction, list(task.reference), turns, random.Random(0), page=env.page
    )
    policy, texts = ExpertPolicy(action_space=space), []
    try:
        while ctx.memory.get("cursor", 0) < n:
            turns.append(Turn(obs.url, obs.title, None, obs.a11y))
            out = await policy.act(ctx)
            texts.append(format_action(out.action))
            obs, _, _, _, info = await env.step(out.action)
            assert info["error"] is None, texts
        cart = await ground(env.page, parse_action('click(css="#cart-link")'), space)
        return [*texts, format_action(cart.action)]  # the last one leaves the path
    finally:
        await env.close()


def _view(task, texts: list[str]) -> TrajectoryView:
    steps = [Step("traj", i, action_text=t) for i, t in enumerate([*texts, None])]
    return TrajectoryView(Trajectory("traj", "run", task.task_id, "model", "failure"), task, steps)


def _scorer(browser, server, client) -> ExactScorer:
    from stages.score_steps import bundled_grade

    async def probe(env: BrowserEnv, task: Any) -> Any:
        origin = server.url(task.site)
        sid = session_of(await env.cookies(origin))
        return await fetch_state(client, origin, server.secret, sid) if sid else {}

    # a reference step that cannot continue after a wrong candidate fails after the action
    # timeout: 3 s (the default 10 s only waits longer for the same outcome)
    env = BrowserEnv(SharedSlot(browser), EnvConfig(action_timeout_s=3.0))
    return ExactScorer([env], _resolve(server), bundled_grade(server, client), probe)


@pytest.mark.browser
@pytest.mark.parametrize("space", ["ref", "coords"])
def test_model_facing_prefix_gets_the_reference_cursor_and_scores_separate(chromium, server, space):
    task, n = _task(), 5  # five steps done: next, choose the colour
    assert task.reference[n].startswith("select(")

    async def go() -> tuple[Any, ...]:
        texts = await _model_facing_prefix(chromium.browser, server, task, n, space)
        assert not any("css=" in t for t in texts)
        followed, diverged = texts[:-1], texts
        async with httpx.AsyncClient() as client:
            scorer = _scorer(chromium.browser, server, client)
            on_path = State(_view(task, followed), len(followed))
            off_path = State(_view(task, diverged), len(diverged))
            at = await scorer.locate(on_path)
            off = await scorer.locate(off_path)
            right = format_action(parse_action(task.reference[n]))
            cands = [Proposal(0, right, right), Proposal(1, "scroll(down)", "scroll(down)")]
            results = await scorer.score(on_path, cands)
        return on_path, at, off, results

    on_path, at, off, results = chromium.run(go())
    assert on_path.cursor() == 0  # action texts never match the reference's css actions
    assert at.cursor() == n  # the page state does
    assert off.cursor() == n  # diverged after step n: its last matching state
    assert all(r.error is None for r in results), [r.error for r in results]
    assert results[0].detail["cursor"] == n
    assert results[0].score == 1.0 and results[1].score < results[0].score


class _Recording(BrowserEnv):
    """A browser environment that keeps each step's action error."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.errors: list[str | None] = []

    async def step(self, action, *, timeout_s=None):
        out = await super().step(action, timeout_s=timeout_s)
        self.errors.append(out[4]["error"])
        return out


@pytest.mark.browser
def test_a_replayed_action_that_failed_when_recorded_gets_the_short_timeout(chromium, server):
    from judging.alignment import REPLAYED_FAILURE_TIMEOUT_S, replay_states

    task = _task()
    actions = ['click(css="#no-such-button")', 'click(css="#no-such-link")']

    async def go() -> list[str | None]:
        env = _Recording(SharedSlot(chromium.browser), EnvConfig(action_timeout_s=1.0))
        try:
            states, ended = await replay_states(
                env, task, actions, _resolve(server), None, failed=[True, False]
            )
            assert len(states) == 3 and not ended
            return env.errors
        finally:
            await env.close()

    first, second = chromium.run(go())
    # both fail the same way; the one recorded as failed waited the short timeout, the other
    # the environment's own
    assert f"Timeout {int(REPLAYED_FAILURE_TIMEOUT_S * 1000)}ms exceeded" in (first or "")
    assert "Timeout 1000ms exceeded" in (second or "")


@pytest.mark.browser
def test_the_expert_waits_for_a_missing_element_as_long_as_an_action_would(chromium, server):
    task = _task()

    async def go() -> tuple[str, str]:
        env = BrowserEnv(SharedSlot(chromium.browser))
        url, allowed = _resolve(server)(task)
        obs, _ = await env.reset(options={"start_url": url, "allowed_origins": allowed})
        try:
            ctx = PolicyContext(
                task.task_id,
                task.instruction,
                ['click(css="#not-on-this-page")'],
                [Turn(obs.url, obs.title, None, obs.a11y)],
                random.Random(0),
                page=env.page,
                action_timeout_s=0.4,
            )
            out = await ExpertPolicy(action_space="ref").act(ctx)
            return format_action(out.action), ctx.memory["grounding_error"]
        finally:
            await env.close()

    action, error = chromium.run(go())
    assert action == 'click(css="#not-on-this-page")'  # the plan's own action: it fails too
    assert "Timeout 400ms exceeded" in error  # not the 10 s default of the grounding
