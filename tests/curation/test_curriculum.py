"""The horizon schedule (TTI): the one reading of a recipe's ``curriculum.horizon`` that the RL
stage's iterations and the flywheel's rounds share."""

from __future__ import annotations

import pytest

from curation.curriculum import horizon_at


def test_the_last_budget_repeats_and_an_empty_schedule_gives_the_default():
    assert [horizon_at([5, 10, 20], i, 99) for i in range(5)] == [5, 10, 20, 20, 20]
    assert [horizon_at((7,), i, 99) for i in range(3)] == [7, 7, 7]
    assert horizon_at((), 0, 30) == horizon_at([], 4, 30) == 30


def test_iterations_count_from_zero():
    # the flywheel's round n (1-based) is iteration n - 1
    assert horizon_at([10, 20], 1 - 1, 30) == 10
    with pytest.raises(ValueError, match="0 is the first"):
        horizon_at([10, 20], -1, 30)
