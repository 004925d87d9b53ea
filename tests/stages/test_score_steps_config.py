"""score-steps refuses settings that cannot score anything before selecting a state, and a
``max_states`` budget takes the states where the policy went wrong first."""

from __future__ import annotations

import pytest

from stages.config import ConfigError
from stages.score_steps import ScoreStepsConfig, check_config, select_states
from warehouse import Warehouse
from warehouse.records import Step, Task, Trajectory


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"k": 1}, "k: 1 is below the minimum 2"),
        ({"candidates": "best"}, "candidates: 'best' is not one of 'sample', 'top_k'"),
        ({"select": "last"}, "select: 'last' is not one of 'failures_first', 'first'"),
        ({"scorer": "vlm"}, "--scorer vlm needs --scorer-base-url and --scorer-model"),
        (
            {
                "scorer": "vlm",
                "scorer_base_url": "http://x",
                "scorer_model": "m",
                "expert_candidate": True,
            },
            "--expert-candidate needs --scorer exact",
        ),
    ],
)
def test_bad_settings_are_refused(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_config(ScoreStepsConfig(**options))
    check_config(ScoreStepsConfig(k=2, candidates="top_k"))  # the edges themselves are fine


def _store(wh: Warehouse, statuses: dict[str, str], n_steps: int = 5) -> None:
    wh.write([Task(task_id="t", suite="s", instruction="Do it", start_url="https://e.com/")])
    trajs = [
        Trajectory(traj_id=t, run_id="r", task_id="t", policy="p", status=st, n_steps=n_steps)
        for t, st in statuses.items()
    ]
    steps = [
        Step(traj_id=t, step_idx=i, action_text=f"click({i}, 1)")
        for t in statuses
        for i in range(n_steps)
    ]
    wh.write_trajectories(trajs, steps)


def test_a_state_budget_takes_failed_trajectories_first_spread_over_the_rest(wh) -> None:
    # ids sort successes first: the old traj-id order would have spent the budget on a-*
    statuses = {f"a-{i}": "success" for i in range(6)}
    statuses |= {"z-fail": "failure", "z-timeout": "timeout"}
    _store(wh, statuses)
    picked = select_states(wh, ScoreStepsConfig(max_states=14, seed=3))
    keys = [(s.traj.traj_id, s.step_idx) for s in picked]
    assert len(keys) == len(set(keys)) == 14
    # all 10 states of the two unsuccessful trajectories, before any successful one
    assert {t for t, _ in keys[:10]} == {"z-fail", "z-timeout"}
    assert {t for t, _ in keys[10:]} <= {f"a-{i}" for i in range(6)}
    # the other 4 are spread by the shuffle, not the first trajectory's first steps
    assert keys[10:] != [("a-0", i) for i in range(4)]
    # the same seed selects the same states (re-runs and shards agree); another seed differs
    again = select_states(wh, ScoreStepsConfig(max_states=14, seed=3))
    assert [(s.traj.traj_id, s.step_idx) for s in again] == keys
    other = select_states(wh, ScoreStepsConfig(max_states=14, seed=4))
    assert [(s.traj.traj_id, s.step_idx) for s in other] != keys
    # a shard's share is the budget's selection restricted to its trajectories
    shard = select_states(wh, ScoreStepsConfig(max_states=14, seed=3), {"z-fail", "a-1"})
    assert [(s.traj.traj_id, s.step_idx) for s in shard] == [
        k for k in keys if k[0] in {"z-fail", "a-1"}
    ]


def test_first_order_and_no_budget_keep_trajectory_id_order(wh) -> None:
    _store(wh, {"a": "success", "b": "failure"}, n_steps=3)
    first = select_states(wh, ScoreStepsConfig(max_states=4, select="first"))
    assert [(s.traj.traj_id, s.step_idx) for s in first] == [("a", 0), ("a", 1), ("a", 2), ("b", 0)]
    everything = select_states(wh, ScoreStepsConfig())
    assert [(s.traj.traj_id, s.step_idx) for s in everything] == [
        (t, i) for t in "ab" for i in range(3)
    ]


def test_the_selection_order_is_part_of_the_run_identity_only_when_it_selects() -> None:
    assert "select" not in ScoreStepsConfig().identity()  # no budget: every state
    assert "select" not in ScoreStepsConfig(max_states=5, select="first").identity()
    assert ScoreStepsConfig(max_states=5).identity()["select"] == "failures_first"


def test_the_expert_candidate_names_a_run_only_when_on():
    """Runs from before the option keep their ids; with it, the scoring (and an RL run using
    it) is another run."""
    from stages.config import config_from_mapping
    from stages.train import RLConfig
    from warehouse.ids import run_id_for

    off, on = ScoreStepsConfig(), ScoreStepsConfig(expert_candidate=True)
    assert "expert_candidate" not in off.identity() and on.identity()["expert_candidate"] is True
    assert run_id_for("score_steps", off.identity()) != run_id_for("score_steps", on.identity())
    rl = {"policy": "ck", "estimator": "step_grpo"}
    plain = config_from_mapping(RLConfig, rl).identity()
    expert = config_from_mapping(RLConfig, {**rl, "prm": {"expert_candidate": True}}).identity()
    assert not any("expert" in k for k in plain) and expert["prm.expert_candidate"] is True
