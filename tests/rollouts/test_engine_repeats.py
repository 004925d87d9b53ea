"""``EngineConfig.max_repeats``: an episode that takes the same action on the same page that many
times ends there (a greedy policy would repeat it to the step budget). Browser-free: the simulated
environment; the real-Chromium case is in ``test_engine.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rollouts.engine import Engine, EngineConfig, Outcome, make_jobs
from rollouts.env import Observation
from rollouts.simenv import A11Y, SimEnv
from tests.rollouts.engine_runner import Scripted
from warehouse.records import Task


class FramedSimEnv(SimEnv):
    """Each observation's refs carry a new frame prefix (``f<step>e4``), as Playwright's do
    after a reload; ``changing``: the page text changes at every step too."""

    def __init__(self, changing: bool = False) -> None:
        super().__init__(lambda rng: 0.0, lambda rng: 0.0)
        self.changing = changing

    async def observe(self) -> Observation:
        tree = A11Y.replace("[ref=e", f"[ref=f{self.step_idx}e")
        if self.changing:
            tree += f'\n  - text "visit {self.step_idx}"'
        return Observation(self.step_idx, self.url, "Simulated page", None, tree)


def run(script: Callable[[int], str], env: Callable[[], object] | None = None, **cfg):
    task = Task(task_id="sim/0", suite="sim", instruction="loop", start_url="sim://0")
    done = []

    async def grade(env, job, answer):
        return Outcome("success" if answer else "failure")

    async def keep(finished):
        done.append(finished)

    async def main():
        engine = Engine(
            "repeats",
            Scripted(script),
            grade,
            keep,
            config=EngineConfig(concurrency=1, max_steps=12, **cfg),
            env_factory=env or (lambda: SimEnv(lambda rng: 0.0, lambda rng: 0.0)),
        )
        await asyncio.wait_for(
            engine.run(make_jobs("repeats", [task], 1, lambda t: ("sim://0", []))), 60
        )

    asyncio.run(main())
    (finished,) = done
    return finished


def test_the_same_action_on_an_unchanged_page_ends_the_episode():
    d = run(lambda i: "scroll(down)", max_repeats=3)
    assert d.trajectory.n_steps == 3
    assert d.trajectory.meta["ended_by"] == "repeated action"
    assert d.trajectory.status == "failure"  # graded as it stands
    # off (the default): the step budget
    d = run(lambda i: "scroll(down)")
    assert d.trajectory.n_steps == 12
    assert d.trajectory.meta["ended_by"] == "step budget"


def test_a_loop_of_two_actions_counts_each_page_action_pair():
    d = run(lambda i: ["scroll(down)", "scroll(up)"][i % 2], max_repeats=3)
    # down, up, down, up, down: the third "down" on the same page ends it
    assert [s.action_text for s in d.steps] == ["scroll(down)", "scroll(up)"] * 2 + ["scroll(down)"]
    assert d.trajectory.meta["ended_by"] == "repeated action"


def test_distinct_actions_and_an_answer_are_not_repeats():
    six = ["click(e1)", "click(e2)", "click(e3)", "click(e4)", "scroll(down)", "scroll(up)"]
    d = run(lambda i: six[i % 6], max_repeats=3)  # 12 steps: each action twice
    assert d.trajectory.n_steps == 12 and d.trajectory.meta["ended_by"] == "step budget"
    d = run(lambda i: "scroll(down)" if i < 2 else 'answer("x")', max_repeats=3)
    assert d.trajectory.n_steps == 3 and d.trajectory.status == "success"
    assert "ended_by" not in d.trajectory.meta


def test_refs_under_a_new_frame_prefix_are_the_same_page_and_element():
    d = run(lambda i: f"click(f{i}e4)", FramedSimEnv, max_repeats=2)
    assert [s.action_text for s in d.steps] == ["click(f0e4)", "click(f1e4)"]
    assert d.trajectory.meta["ended_by"] == "repeated action"
    # a page whose content changes is not the same page
    d = run(lambda i: f"click(f{i}e4)", lambda: FramedSimEnv(changing=True), max_repeats=2)
    assert d.trajectory.n_steps == 12 and d.trajectory.meta["ended_by"] == "step budget"
