"""RL group rows (:mod:`curation.rl_rows`): group-relative advantages. The rows themselves are
checked on engine-written trajectories in :mod:`tests.curation.test_examples`."""

from __future__ import annotations

import pytest

from curation.rl_rows import group_advantages


def test_advantages_are_relative_to_the_group_and_scaled_by_its_std():
    # rewards 1,0,0,0: mean 0.25, population std sqrt(0.1875) = 0.433 (plus GRPO's 1e-6)
    std = 0.1875**0.5 + 1e-6
    assert group_advantages([1.0, 0.0, 0.0, 0.0]) == pytest.approx(
        [0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std], rel=1e-12
    )
    assert group_advantages([1.0, 1.0]) == [0.0, 0.0]
    assert group_advantages([]) == []
