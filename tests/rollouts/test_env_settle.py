"""An observation shows what an action's requests render: typing into the travel site's
autocomplete fetches suggestions, and the snapshot after the step must hold them (the next action
clicks one)."""

from __future__ import annotations

import re

import pytest

from rollouts.actions import parse_action
from rollouts.browser import SharedSlot
from rollouts.env import BrowserEnv, EnvConfig, origin_of

pytestmark = pytest.mark.browser


def test_the_snapshot_after_typing_holds_the_fetched_suggestions(server, chromium):
    start = server.url("travel") + "/"
    cfg = EnvConfig(action_timeout_s=3, screenshots=False)

    async def go():
        env = BrowserEnv(SharedSlot(chromium.browser), cfg)
        try:
            obs = await env.reset(start, allowed_origins=[origin_of(start)], max_steps=5)
            assert "- option" not in obs.a11y
            ref = re.search(r'textbox "From[^"]*" \[ref=(e\d+)\]', obs.a11y).group(1)
            obs, *_ = await env.step(parse_action(f'type({ref}, "Dor")'))  # one input event
            return obs.a11y
        finally:
            await env.close()

    tree = chromium.run(go())
    options = [line for line in tree.splitlines() if "- option" in line]
    assert options, tree
    assert all("Dor" in line for line in options)
