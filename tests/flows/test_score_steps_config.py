"""score-steps refuses settings that cannot score anything before selecting a state."""

from __future__ import annotations

import pytest

from flows.score_steps import ScoreStepsConfig, check_config
from warehouse import WarehouseError


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"k": 1}, "--k must be at least 2"),
        ({"candidates": "best"}, "candidates are 'sample' or 'top_k', not 'best'"),
    ],
)
def test_bad_settings_are_refused(options: dict, message: str) -> None:
    with pytest.raises(WarehouseError, match=message):
        check_config(ScoreStepsConfig(**options))
    check_config(ScoreStepsConfig(k=2, candidates="top_k"))  # the edges themselves are fine
