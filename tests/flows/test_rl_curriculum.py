"""The failures-first curriculum's pick (``flows.train.failures_first``) against hand values;
the flow around it (a greedy probe run, then sampling on the picked tasks) is checked in
``test_stage_flows.py``."""

from __future__ import annotations

from flows.train import failures_first

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
