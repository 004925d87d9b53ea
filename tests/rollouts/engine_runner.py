"""The rollout engine over bundled tasks on the session's shared Chromium, graded by the sites'
checkers: one helper for the tests that need finished episodes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from rollouts.actions import parse_action
from rollouts.browser import SharedSlot
from rollouts.engine import Engine, EngineConfig, Finished, Outcome, make_jobs
from rollouts.env import BrowserEnv, EnvConfig, origin_of
from rollouts.policies import PolicyContext, PolicyOutput
from sites.grading import grade_session
from sites.tasks import resolve_start_url


class Scripted:
    """A policy whose action at step i is ``script(i)``."""

    name = "scripted"

    def __init__(self, script: Callable[[int], str]) -> None:
        self.script = script

    async def act(self, ctx: PolicyContext) -> PolicyOutput:
        text = self.script(len(ctx.turns) - 1)
        return PolicyOutput(text, parse_action(text))


def run_on_chromium(
    chromium: Any,
    server: Any,
    policy: Any,
    tasks: list[Any],
    *,
    run_id: str = "test-run",
    env_cfg: EnvConfig | None = None,
    **engine_cfg: Any,
) -> list[Finished]:
    """Every task once through the engine (``engine_cfg``: EngineConfig fields); the finished
    episodes, graded (``meta.criteria`` holds the checker's criteria)."""
    env_cfg = env_cfg or EnvConfig()

    async def go() -> list[Finished]:
        done: list[Finished] = []
        slot = SharedSlot(chromium.browser)
        async with httpx.AsyncClient() as client:

            async def grade(env: BrowserEnv, job: Any, answer: str | None) -> Outcome:
                v = await grade_session(client, server, job.task, env.cookies, answer)
                return Outcome(v.verdict, {"criteria": v.to_dict()["criteria"]})

            async def sink(f: Finished) -> None:
                done.append(f)

            def resolve(t: Any) -> tuple[str, list[str]]:
                url = resolve_start_url(t.start_url, server.urls)
                return url, [origin_of(url)]

            engine = Engine(
                run_id,
                policy,
                grade,
                sink,
                config=EngineConfig(**engine_cfg),
                env_config=env_cfg,
                env_factory=lambda: BrowserEnv(slot, env_cfg),
            )
            await engine.run(make_jobs(run_id, tasks, 1, resolve))
        return done

    return chromium.run(go())
