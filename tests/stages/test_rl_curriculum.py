"""The failures-first curriculum's pick (``flows.train.failures_first``) against hand values;
the flow around it (a greedy probe run, then sampling on the picked tasks) is checked in
``test_stage_flows.py``."""

from __future__ import annotations

import pytest

from stages.train import failures_first

ORDER = ["t1", "t2", "t3", "t4", "t5", "t6"]


def test_unsolved_first_then_solved_each_in_the_seeded_order():
    status = {"t1": "success", "t2": "failure", "t3": "success", "t4": "timeout", "t5": "failure"}
    status["t6"] = "success"
    assert failures_first(ORDER, status, 4) == ("t2", "t4", "t5", "t1")
    assert failures_first(ORDER, status, 2) == ("t2", "t4")
    assert failures_first(ORDER, status, 10) == ("t2", "t4", "t5", "t1", "t3", "t6")


def test_episodes_without_an_outcome_are_left_out():
    status = {"t1": "infra_error", "t2": "success", "t3": "failure"}  # t4-t6: no episode
    assert failures_first(ORDER, status, 6) == ("t3", "t2")
    assert failures_first(ORDER, {"t1": "infra_error"}, 3) == ()


def test_settings_that_cannot_work_together_are_refused_before_anything_starts():
    from stages.config import config_from_mapping
    from stages.train import RLConfig
    from training.interface import DataMismatch

    def rl(**kw):
        return config_from_mapping(RLConfig, {"policy": "p", **kw})

    rl(rollout={"n_tasks": 8}, task_pool=9).check()  # a pool larger than the batch
    rl(anchor_dataset="d", anchor_coef=1.0).check()
    with pytest.raises(DataMismatch, match="task_pool 8 must exceed n_tasks 8"):
        rl(rollout={"n_tasks": 8}, task_pool=8).check()
    with pytest.raises(DataMismatch, match=r"anchor_coef 0\.5 needs an anchor dataset"):
        RLConfig(policy="p", anchor_coef=0.5).check()
