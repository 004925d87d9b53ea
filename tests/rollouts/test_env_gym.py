"""The browser environment's Gymnasium signatures: ``reset(*, seed, options) → (obs, info)`` and
``step(action) → (obs, reward, terminated, truncated, info)``; a seed makes the page's
``Math.random`` repeat."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

from rollouts.actions import parse_action
from rollouts.browser import SharedSlot
from rollouts.env import BrowserEnv, EnvConfig
from rollouts.localserver import ThreadedServer

PAGE = """<!doctype html><title>r</title><body><p id="r"></p><script>
document.getElementById("r").textContent =
  "draws " + [Math.random(), Math.random(), Math.random()].map(x => x.toFixed(12)).join(" ");
document.title = document.getElementById("r").textContent;
</script></body>"""


@pytest.fixture(scope="module")
def page_url():
    app = Starlette(routes=[Route("/", lambda request: HTMLResponse(PAGE))])
    with ThreadedServer(app) as server:
        yield server.base + "/"


async def _draws(env: BrowserEnv, url: str, seed: int | None) -> tuple[str, dict]:
    obs, info = await env.reset(seed=seed, options={"start_url": url, "max_steps": 2})
    return obs.title, info


@pytest.mark.browser
def test_a_seeded_reset_repeats_the_pages_random_draws_and_step_is_gymnasiums(
    chromium, page_url: str
) -> None:
    env = BrowserEnv(SharedSlot(chromium.browser), EnvConfig(screenshots=False))

    async def episode() -> tuple:
        a, info = await _draws(env, page_url, 7)
        b, _ = await _draws(env, page_url, 7)
        c, _ = await _draws(env, page_url, 8)
        _, reward, terminated, truncated, step_info = await env.step(parse_action("scroll(down)"))
        _, _, terminated2, truncated2, _ = await env.step(parse_action('answer("done")'))
        await env.close()
        return a, b, c, info, (reward, terminated, truncated, step_info), (terminated2, truncated2)

    a, b, c, info, first, second = chromium.run(episode())
    assert a.startswith("draws 0.") and a == b and a != c  # the seed decides the draws
    assert info["start_url"] == page_url and info["allowed_origins"] == [page_url.rstrip("/")]
    reward, terminated, truncated, step_info = first
    assert (reward, terminated, truncated) == (0.0, False, False) and step_info["error"] is None
    assert second == (True, False)  # answer() terminates (within the step budget of 2)


def test_reset_needs_a_start_url_and_refuses_unknown_options() -> None:
    import asyncio

    env = BrowserEnv(SharedSlot(browser=None), EnvConfig())
    with pytest.raises(ValueError, match="needs the start URL"):
        asyncio.run(env.reset(seed=1))
    with pytest.raises(ValueError, match=r"unknown options \['start'\]"):
        asyncio.run(env.reset(options={"start_url": "http://x.test/", "start": 1}))
