"""Rationales (ERA): the expert's template thought, the model's thought parsed or rejected, and
a resumable run over a hand-built warehouse (teacher model: a real local OpenAI-protocol
server)."""

from __future__ import annotations

import asyncio

import pytest

from curation.rationales import (
    RationaleError,
    RationalesConfig,
    expert_thought,
    parse_thought,
    run_rationales_async,
)
from rollouts.prompts import PromptConfig, Turn, build_messages
from tests.rollouts.fake_openai import FakeOpenAI, last_user_text
from warehouse.records import Rationale, Step, Task, Trajectory, from_frame

REF = ['click(css="#accept-cookies")', 'type(css="#search-input", "Mug")', 'answer("$4")']
TREE = (
    '- banner:\n  - button "Accept cookies" [ref=e3] [cursor=pointer]\n'
    '  - searchbox "Search" [ref=e7]'
)
INSTRUCTION = "What does the Mug cost?"


def step(i: int, plan: int, action: str, target: dict | None = None, **kw) -> Step:
    return Step(
        "traj-x",
        i,
        model_output=f"Thought: step {plan} of the plan.\nAction: {action}",
        action_text=action,
        action={"type": "click", "target": target} if target else None,
        **kw,
    )


def test_expert_thought_names_the_plan_step_and_the_element():
    s = step(0, 1, "click(e3)", {"ref": "e3"})
    assert expert_thought(INSTRUCTION, REF, s, TREE) == (
        "The task: What does the Mug cost? Step 1 of the 3-step plan is to click the button "
        '"Accept cookies". On this page that is click(e3).'
    )
    typed = step(1, 2, 'type(e7, "Mug")', {"ref": "e7"})
    assert 'is to type "Mug" into the searchbox "Search".' in expert_thought(
        INSTRUCTION, REF, typed, TREE
    )
    coords = step(1, 2, 'type(640, 80, "Mug")', {"x": 640, "y": 80})  # no ref: the selector
    assert 'type "Mug" into the element #search-input.' in expert_thought(
        INSTRUCTION, REF, coords, TREE
    )
    answer = step(2, 3, 'answer("$4")')
    assert 'is to answer "$4", which the page shows.' in expert_thought(
        INSTRUCTION, REF, answer, None
    )
    scroll = Step(
        "traj-x",
        1,
        model_output="Thought: step 2 of the plan is out of view.\nAction: scroll(0, 300)",
    )
    assert expert_thought(INSTRUCTION, REF, scroll, None).endswith(
        "needs the element #search-input, which is out of view, so I scroll to it first."
    )


def test_expert_thought_refuses_steps_it_cannot_place_on_the_plan():
    with pytest.raises(RationaleError, match="names no step"):
        expert_thought(INSTRUCTION, REF, Step("t", 0, model_output="Thought: done."), None)
    with pytest.raises(RationaleError, match="not in the 3-step"):
        expert_thought(INSTRUCTION, REF, step(0, 7, "click(e3)"), None)


@pytest.mark.parametrize(
    "reply, why",
    [
        ("I clicked it.", "no 'Thought:'"),
        ("Thought: ok", "too short"),
        ("Thought: " + "12345 67890 ###### " * 5, "not text"),
        ("Thought: " + "word " * 500, "longer than"),
    ],
)
def test_garbage_thoughts_are_rejected(reply, why):
    with pytest.raises(RationaleError, match=why):
        parse_thought(reply)


def test_a_thought_is_kept_up_to_the_action_line():
    reply = "Thought: The cookie banner hides the page, so accept it first.\nAction: click(e3)"
    assert parse_thought(reply) == "The cookie banner hides the page, so accept it first."


def _warehouse(wh) -> None:
    task = Task("task-mug", "bundled", INSTRUCTION, "bundled://shop/", site="shop", reference=REF)
    shot = wh.blobs.put_image(_png()).hash
    tree = wh.blobs.put(TREE.encode()).hash
    rows = [
        step(0, 1, "click(e3)", {"ref": "e3"}, screenshot_hash=shot, a11y_hash=tree),
        step(1, 2, 'type(e7, "Mug")', {"ref": "e7"}, screenshot_hash=shot, a11y_hash=tree),
        step(2, 3, 'answer("$4")', screenshot_hash=shot, a11y_hash=tree),
    ]
    traj = Trajectory("traj-x", "run-c", "task-mug", "expert", "success", task_version=1, n_steps=3)
    failed = Trajectory(
        "traj-f", "run-c", "task-mug", "expert", "failure", task_version=1, n_steps=1
    )
    wh.write([task])
    wh.write_trajectories([traj, failed], [*rows, Step("traj-f", 0, action_text="click(e3)")])


def _png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 4), "white").save(buf, format="PNG")
    return buf.getvalue()


def test_expert_rationales_for_successful_expert_trajectories_only_and_resumable(wh):
    _warehouse(wh)
    out = asyncio.run(run_rationales_async(wh, RationalesConfig(), "run-r"))
    assert (out["selected"], out["written"], out["errors"]) == (3, 3, 0)
    rows = from_frame(Rationale, wh.sql("SELECT * FROM rationales ORDER BY step_idx"))
    assert [(r.traj_id, r.step_idx, r.teacher, r.run_id) for r in rows] == [
        ("traj-x", i, "expert", "run-r") for i in range(3)
    ]  # the failed trajectory has none
    assert rows[1].thought.startswith("The task: What does the Mug cost? Step 2 of the 3-step")
    again = asyncio.run(run_rationales_async(wh, RationalesConfig(), "run-r"))
    assert (again["selected"], again["written"]) == (0, 0)


def test_model_rationales_see_the_policy_prompt_garbage_is_a_step_error(wh):
    _warehouse(wh)
    replies = [
        "Thought: The cookie banner must go before anything else.",
        "no idea",
        "Thought: The price is shown next to the Mug.",
    ]
    with FakeOpenAI([("reply", r) for r in replies]) as fake:
        cfg = RationalesConfig(teacher="openai", base_url=fake.url, model="teach", concurrency=1)
        out = asyncio.run(run_rationales_async(wh, cfg, "run-r"))
        first = fake.requests[0]
        second_text = last_user_text(fake.requests[1])
    assert (out["selected"], out["written"], out["errors"]) == (3, 2, 1)
    assert out["error_examples"] == ["traj-x#1: no 'Thought:' in the reply: 'no idea'"]
    # the context is exactly the policy's view of step 0, then the action taken
    turns = [Turn("", "", _png(), TREE)]
    policy_view = build_messages(INSTRUCTION, turns, PromptConfig())
    assert first["messages"][0] == policy_view[0]
    assert first["messages"][1]["content"][:-1] == policy_view[1]["content"]
    assert "click(e3)" in first["messages"][1]["content"][-1]["text"]
    assert "Previous actions:\n1. click(e3)" in second_text and 'type(e7, "Mug")' in second_text
    rows = wh.sql("SELECT step_idx, teacher, model, prompt_hash FROM rationales ORDER BY 1").rows()
    assert [(i, t, m) for i, t, m, _ in rows] == [
        (0, "openai:teach", "teach"),
        (2, "openai:teach", "teach"),
    ]
    assert all(len(h) == 64 for *_, h in rows)
    with FakeOpenAI([("reply", "Thought: Typing the name finds the Mug.")]) as fake:
        cfg = RationalesConfig(teacher="openai", base_url=fake.url, model="teach")
        retry = asyncio.run(run_rationales_async(wh, cfg, "run-r"))
    assert (retry["selected"], retry["written"], len(fake.requests)) == (1, 1, 1)
