"""Advantage estimators against values computed by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from training.advantages import ESTIMATORS, compute_advantages, fit_value_baseline


def test_registry_names_and_options():
    assert ESTIMATORS.names() == ["awr", "grpo", "step_awr", "step_best", "step_grpo", "turn"]
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'"):
        ESTIMATORS.make("nope")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['gama'\]"):
        ESTIMATORS.make("awr", gama=0.9)


def test_grpo_hand_values_and_infra_rows():
    frame = pl.DataFrame(
        {
            # group g: trajectories a (R=1, 2 turns), b (R=0), c (R=0, 2 turns), x (infra, R=1)
            # group h: d alone -> 0; group k: e and f both R=1 (constant) -> 0
            "traj_id": ["a", "a", "b", "c", "c", "x", "d", "e", "f"],
            "group_id": ["g", "g", "g", "g", "g", "g", "h", "k", "k"],
            "reward": [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0],
            "status": ["success"] * 5 + ["infra_error"] + ["success"] * 3,
        }
    )
    out = compute_advantages("grpo", frame)
    # group g over trajectories a, b, c (x excluded): mean 1/3, population std sqrt(2/9) = 0.471405
    # a: (1 - 1/3) / 0.471405 = 1.414214; b, c: (0 - 1/3) / 0.471405 = -0.707107
    expected = [1.414214, 1.414214, -0.707107, -0.707107, -0.707107, 0.0, 0.0, 0.0, 0.0]
    assert out["advantage"].to_list() == pytest.approx(expected, abs=1e-5)
    assert out.columns == [*frame.columns, "advantage"]
    # the infra row would have changed the statistics had it counted: without "status" it does
    counted = compute_advantages("grpo", frame.drop("status"))
    assert counted["advantage"][0] == pytest.approx(1.0, abs=1e-5)  # mean .5, std .5 -> 1


def test_grpo_rejects_varying_reward_and_missing_columns():
    bad = pl.DataFrame({"traj_id": ["a", "a"], "group_id": ["g", "g"], "reward": [1.0, 0.0]})
    with pytest.raises(ValueError, match=r"'reward' must be one value per trajectory.*'a'"):
        compute_advantages("grpo", bad)
    with pytest.raises(ValueError, match=r"missing column\(s\) \['group_id'\]"):
        compute_advantages("grpo", bad.drop("group_id"))
    nulls = pl.DataFrame({"traj_id": ["a"], "group_id": ["g"], "reward": [None]})
    with pytest.raises(ValueError, match=r"'reward' is null/NaN.*row 0"):
        compute_advantages("grpo", nulls.cast({"reward": pl.Float64}))


# three states: (a,0) with scores 1, 3, 2 and a timeout row, (a,1) one candidate, (b,0) a tie
SCORED = pl.DataFrame(
    {
        "traj_id": ["a", "a", "a", "a", "a", "b", "b"],
        "step_idx": [0, 0, 0, 0, 1, 0, 0],
        "score": [1.0, 3.0, 2.0, 100.0, 5.0, 2.0, 2.0],
        "status": ["ok", "ok", "ok", "timeout", "ok", "ok", "ok"],
    }
)


def test_step_grpo_hand_values():
    frame = SCORED
    out = compute_advantages("step_grpo", frame)
    # state (a,0): scores 1, 3, 2 (the timeout row excluded): mean 2, std sqrt(2/3) = 0.816497
    # -> -1.224745, 1.224745, 0; state (a,1) has one candidate -> 0; state (b,0) constant -> 0
    expected = [-1.224745, 1.224745, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert out["advantage"].to_list() == pytest.approx(expected, abs=1e-5)


def test_step_awr_hand_values():
    frame = SCORED
    out = compute_advantages("step_awr", frame, beta=0.5, w_max=4.0)
    # advantages as step_grpo: (a,0) -> -1.224745, 1.224745, 0; the rest 0
    expected = [-1.224745, 1.224745, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert out["advantage"].to_list() == pytest.approx(expected, abs=1e-5)
    # weight = min(exp(A / 0.5), 4) where the state's candidates differ: exp(-2.449490) =
    # 0.086334, exp(2.449490) = 11.58 -> 4, exp(0) = 1; the timeout row, the lone candidate of
    # (a,1) and the equal candidates of (b,0) weigh 0
    assert out["weight"].to_list() == pytest.approx([0.086334, 4.0, 1.0, 0, 0, 0, 0], abs=1e-5)
    with pytest.raises(ValueError, match="beta > 0"):
        compute_advantages("step_awr", frame, beta=0.0)


def test_step_best_weighs_only_the_best_candidates_of_states_with_a_signal():
    out = compute_advantages("step_best", SCORED)
    # advantages as step_grpo; weight 1 only on (a,0)'s best candidate (score 3): the worse
    # ones, the timeout row, the lone candidate of (a,1) and the equal ones of (b,0) weigh 0
    expected = [-1.224745, 1.224745, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert out["advantage"].to_list() == pytest.approx(expected, abs=1e-5)
    assert out["weight"].to_list() == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    # two candidates tied at the top both weigh 1 (a reference label matched twice)
    tied = pl.DataFrame({"traj_id": ["a"] * 3, "step_idx": [0] * 3, "score": [1.0, 0.0, 1.0]})
    assert compute_advantages("step_best", tied)["weight"].to_list() == [1.0, 0.0, 1.0]


def test_step_estimators_see_no_signal_in_equal_scores():
    # seven candidates scoring 0.1: polars' std of them is 1.4e-17, and "std > 0" gave them
    # weight exp(~0) = 1 each; equal scores are no signal: advantage 0, weight 0
    frame = pl.DataFrame({"traj_id": ["a"] * 7, "step_idx": [0] * 7, "score": [0.1] * 7})
    assert compute_advantages("step_grpo", frame)["advantage"].to_list() == [0.0] * 7
    out = compute_advantages("step_awr", frame)
    assert out["advantage"].to_list() == [0.0] * 7 and out["weight"].to_list() == [0.0] * 7
    assert compute_advantages("step_best", frame)["weight"].to_list() == [0.0] * 7


def test_awr_hand_values():
    frame = pl.DataFrame(
        {
            # rows out of order on purpose: t is the position by step_idx
            "traj_id": ["a", "a", "a", "b", "b", "b"],
            "step_idx": [2, 0, 1, 0, 1, 2],
            "reward": [1.0, 1.0, 1.0, 0.0, 0.0, 0.0],
            "value": [0.5, 0.2, 0.4, 0.1, 0.3, 9.0],
            "status": ["success"] * 5 + ["infra_error"],
        }
    )
    out = compute_advantages("awr", frame, gamma=0.9, beta=0.5, w_max=2.0)
    # a: T=3. G_2 = 1, G_0 = 0.81, G_1 = 0.9 -> A = 0.5, 0.61, 0.5
    # b: T=2 (infra row dropped). G = 0 -> A = -0.1, -0.3; infra row: A 0, weight 0
    assert out["advantage"].to_list() == pytest.approx([0.5, 0.61, 0.5, -0.1, -0.3, 0.0])
    # weight = min(exp(A / 0.5), 2): exp(1) = 2.718 -> 2; exp(1.22) -> 2; exp(-0.2) = 0.818731;
    # exp(-0.6) = 0.548812
    assert out["weight"].to_list() == pytest.approx(
        [2.0, 2.0, 2.0, 0.818731, 0.548812, 0.0], abs=1e-6
    )


def test_turn_hand_values():
    frame = pl.DataFrame(
        {
            "traj_id": ["a", "a", "a", "b", "b"],
            "step_idx": [2, 0, 1, 0, 1],
            "progress": [1.0, 0.5, 0.5, 0.0, 0.5],
            "reward": [1.0, 1.0, 1.0, 0.0, 0.0],
        }
    )
    out = compute_advantages("turn", frame, gamma=0.9)
    # a: r = 0.5, 0.0, 0.5 + 1 = 1.5 -> returns t2 = 1.5, t1 = 0 + 0.9*1.5 = 1.35,
    #    t0 = 0.5 + 0.9*1.35 = 1.715;  b: r = 0.0, 0.5 -> t1 = 0.5, t0 = 0.45
    raw = np.array([1.5, 1.715, 1.35, 0.45, 0.5])  # in the frame's row order
    # mean 1.103; deviations .397 .612 .247 -.653 -.603, population std sqrt(1.38318 / 5) = 0.525963
    assert raw.mean() == pytest.approx(1.103)
    expected = (raw - 1.103) / np.sqrt(((raw - 1.103) ** 2).mean())
    assert out["advantage"].to_list() == pytest.approx(expected.tolist(), abs=1e-5)
    assert out["advantage"][1] == pytest.approx((1.715 - 1.103) / 0.525963, abs=1e-5)


def test_turn_rejects_progress_out_of_range():
    frame = pl.DataFrame({"traj_id": ["a"], "step_idx": [0], "progress": [1.5], "reward": [1.0]})
    with pytest.raises(ValueError, match=r"progress must lie in \[0, 1\]"):
        compute_advantages("turn", frame)


def test_fit_value_baseline_closed_form():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 2))
    y = 2 * x[:, 0] - x[:, 1] + 3
    base = fit_value_baseline(x, y, ridge=0.0)
    assert base.coef == pytest.approx([2.0, -1.0])
    assert base.intercept == pytest.approx(3.0)
    assert base.predict(np.array([[1.0, 1.0]])) == pytest.approx([4.0])
    # 1-D ridge by hand: x 0..3, y = 2x + 1; centred Σx² = 5, Σxy = 10; λ = 5 -> w = 10/10 = 1,
    # b = mean y − mean x · w = 4 − 1.5 = 2.5 (the intercept is not shrunk)
    shrunk = fit_value_baseline(np.arange(4.0)[:, None], [1.0, 3.0, 5.0, 7.0], ridge=5.0)
    assert shrunk.coef == pytest.approx([1.0]) and math.isclose(shrunk.intercept, 2.5)
    with pytest.raises(ValueError, match="3 feature rows but 2 targets"):
        fit_value_baseline(np.zeros((3, 1)), [1.0, 2.0])
