"""The engine's stop rules (:mod:`rollouts.stop_rules`) as pure functions: which rule ends an
episode, in which order, and what counts as the same action on the same page. The engine runs
that apply them are in ``test_engine.py`` and ``test_engine_repeats.py``."""

from __future__ import annotations

import pytest

from rollouts.env import Observation
from rollouts.stop_rules import (
    ANSWERED,
    INVALID_ACTIONS,
    REPEATED_ACTION,
    STEP_BUDGET,
    after_action,
    after_invalid_action,
    repeat_key,
)
from warehouse.records import Step


@pytest.mark.parametrize(
    ("invalid_run", "n_steps", "expected"),
    [
        (1, 1, None),
        (2, 29, None),
        (3, 3, INVALID_ACTIONS),  # max_invalid in a row
        (1, 30, STEP_BUDGET),  # an invalid step spends the budget too
        (3, 30, INVALID_ACTIONS),  # both: the invalid run is named
    ],
)
def test_invalid_actions_end_an_episode_in_a_row_or_at_the_budget(invalid_run, n_steps, expected):
    assert after_invalid_action(invalid_run, n_steps, max_invalid=3, max_steps=30) == expected


@pytest.mark.parametrize(
    ("terminated", "truncated", "times_here", "max_repeats", "expected"),
    [
        (False, False, 0, 0, None),
        (True, False, 0, 0, ANSWERED),
        (True, True, 5, 2, ANSWERED),  # an answer wins over the budget and the repeats
        (False, True, 5, 2, STEP_BUDGET),
        (False, False, 1, 2, None),
        (False, False, 2, 2, REPEATED_ACTION),
        (False, False, 9, 0, None),  # max_repeats 0: repeats never end an episode
    ],
)
def test_an_action_ends_an_episode_by_answer_budget_or_repeats(
    terminated, truncated, times_here, max_repeats, expected
):
    assert after_action(terminated, truncated, times_here, max_repeats) == expected


def step(action_text: str | None, screenshot: str | None = "s1") -> Step:
    return Step(traj_id="t", step_idx=0, screenshot_hash=screenshot, action_text=action_text)


def obs(tree: str | None, url: str = "http://h/a") -> Observation:
    return Observation(0, url, "T", None, tree)


def test_the_same_page_ignores_frame_prefixes_of_refs_and_nothing_else():
    same = repeat_key(obs('- button "Go" [ref=f1e4]'), step("click(f1e4)"))
    assert same == repeat_key(obs('- button "Go" [ref=f7e4]'), step("click(f7e4)"))
    assert same == repeat_key(obs('- button "Go" [ref=e4]'), step("click(e4)"))
    assert same != repeat_key(obs('- button "Go" [ref=f1e5]'), step("click(f1e5)"))
    assert same != repeat_key(obs('- button "Go" [ref=f1e4]', "http://h/b"), step("click(f1e4)"))
    assert same != repeat_key(obs('- button "Go" [ref=f1e4]'), step("click(f1e4)", "s2"))
    assert repeat_key(obs(None), step(None)) == ("http://h/a", "s1", None, "")
