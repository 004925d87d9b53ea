"""The expert records and executes model-facing actions: accessibility refs or coordinates (or
set-of-marks ids), never the reference's ``css=`` targets, and still solves every task template
of every site — through the engine, the policy path collection uses."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from rollouts.actions import Click, Select, Type, parse_action
from rollouts.browser import execute
from rollouts.engine import Finished
from rollouts.env import EnvConfig
from rollouts.grounding import ground
from rollouts.policies import ExpertPolicy, expert_action_space
from sites.tasks import TEMPLATES, generate, resolve_start_url
from tests.rollouts.engine_runner import run_on_chromium


def one_per_template() -> list[Any]:
    """One task of every template (every site), in a fixed order."""
    seen: dict[str, Any] = {}
    for t in generate(200, seed=3):
        seen.setdefault(t.meta["template"], t)
    assert set(seen) == set(TEMPLATES)
    return [seen[k] for k in sorted(seen)]


def collect(chromium, server, tasks, space: str, coords: str = "pixels") -> list[Finished]:
    return run_on_chromium(
        chromium,
        server,
        ExpertPolicy(action_space=space, coords=coords),
        tasks,
        run_id=f"expert-{space}",
        env_cfg=EnvConfig(coords=coords, set_of_marks=space == "marks"),
        concurrency=3,
        max_steps=60,
    )


def _targets(f: Finished) -> list[Any]:
    return [
        parse_action(s.action_text).target
        for s in f.steps
        if s.action_text and isinstance(parse_action(s.action_text), Click | Type | Select)
    ]


@pytest.mark.browser
def test_ref_mode_expert_emits_snapshot_refs_and_solves_every_template(chromium, server):
    tasks = one_per_template()
    done = collect(chromium, server, tasks, "ref")
    assert len(done) == len(tasks)
    for f in done:
        texts = [s.action_text or "" for s in f.steps]
        assert not any("css=" in t for t in texts), (f.trajectory.task_id, texts)
        assert f.trajectory.status == "success", (f.trajectory.task_id, texts)
        assert all(t.ref for t in _targets(f)), texts
        for s in f.steps:  # the ref is one the model's observation at that step shows
            m = re.search(r"\((e\d+)", s.action_text or "")
            if m:
                assert f"[ref={m.group(1)}]" in f.blobs[s.a11y_hash].decode(), s.action_text


@pytest.mark.browser
def test_coordinate_mode_expert_emits_points_and_solves_every_template(chromium, server):
    tasks = one_per_template()
    done = collect(chromium, server, tasks, "coords")
    for f in done:
        texts = [s.action_text or "" for s in f.steps]
        assert not any("css=" in t or re.search(r"\be\d+\b", t) for t in texts), texts
        assert f.trajectory.status == "success", (f.trajectory.task_id, texts)
        points = _targets(f)  # none for tasks answered from the start page
        assert all(t.x is not None and 0 <= t.x < 1280 for t in points), texts
        assert all(0 <= t.y < 800 for t in points), texts
    assert sum(len(_targets(f)) for f in done) > len(done)


@pytest.mark.browser
def test_norm1000_and_marks_spaces_on_a_long_task(chromium, server):
    shop_buy = next(t for t in generate(200, seed=3) if t.meta["template"] == "shop_buy")
    norm = collect(chromium, server, [shop_buy], "coords", coords="norm1000")[0]
    assert norm.trajectory.status == "success"
    assert all(t.x is not None and t.x < 1000 and t.y < 1000 for t in _targets(norm))
    marks = collect(chromium, server, [shop_buy], "marks")[0]
    assert marks.trajectory.status == "success"
    assert not any("css=" in (s.action_text or "") for s in marks.steps)
    assert any(t.mark is not None for t in _targets(marks))


def test_action_space_follows_the_prompt_mode():
    assert expert_action_space("both") == "ref"
    assert expert_action_space("a11y") == "ref"
    assert expert_action_space("screenshot") == "coords"
    assert expert_action_space("screenshot", set_of_marks=True) == "marks"
    with pytest.raises(ValueError):
        ExpertPolicy(action_space="xpath")


def test_without_a_page_the_expert_emits_its_plan():
    from rollouts.policies import PolicyContext

    ctx = PolicyContext("t", "do", ['click(css="#go")'], [], __import__("random").Random(0))
    out = asyncio.run(ExpertPolicy().act(ctx))
    assert out.action == parse_action('click(css="#go")')


@pytest.mark.browser
def test_grounded_type_and_select_at_coordinates_replace_values(chromium, server):
    """``type(x, y, …)`` replaces the field's value (like a ref target); ``select(x, y, …)``
    chooses an option of the <select> at the point."""
    task = next(t for t in generate(200, seed=3) if t.meta["template"] == "shop_buy")

    async def go() -> tuple[str, str, str]:
        ctx = await chromium.browser.new_context(viewport={"width": 1280, "height": 800})
        try:
            page = await ctx.new_page()
            await page.goto(resolve_start_url(task.start_url, server.urls))
            for text in task.reference[:5]:  # to a product page
                g = await ground(page, parse_action(text), "coords")
                assert (await execute(page, g.action)).error is None
            qty = await ground(page, parse_action('type(css="#qty", "3")'), "coords")
            assert qty.action.target.x is not None
            await execute(page, qty.action)
            await execute(page, qty.action)  # twice: replaced, not "33"
            options = await page.locator("#color option").all_inner_texts()
            sel = await ground(
                page, parse_action(f'select(css="#color", "{options[-1]}")'), "coords"
            )
            assert (await execute(page, sel.action)).error is None
            return (
                await page.input_value("#qty"),
                await page.eval_on_selector("#color", "e => e.options[e.selectedIndex].text"),
                options[-1],
            )
        finally:
            await ctx.close()

    qty, chosen, wanted = chromium.run(go())
    assert qty == "3" and chosen == wanted
