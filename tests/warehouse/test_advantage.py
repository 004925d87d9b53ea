"""The group-relative advantage (warehouse/advantage.py), the one GRPO normalisation of
judging.prm's stored advantages, training's estimators and the dashboard, by hand."""

from __future__ import annotations

import polars as pl
import pytest

from warehouse.advantage import EPS, group_relative, group_relative_values, varies


def test_hand_values_with_the_epsilon():
    # mean 0.25, population std sqrt(0.1875) = 0.4330127
    std = 0.1875**0.5
    assert group_relative_values([1.0, 0.0, 0.0, 0.0]) == pytest.approx(
        [0.75 / (std + EPS), -0.25 / (std + EPS), -0.25 / (std + EPS), -0.25 / (std + EPS)],
        rel=1e-12,
    )
    assert group_relative_values([1.0, 0.0, 0.0, 0.0])[0] == pytest.approx(1.7320468, abs=1e-7)
    # a null is left out of the mean and std (mean 0.5, std 0.5) and gets no advantage
    up, none, down = group_relative_values([1.0, None, 0.0])
    assert (up, none, down) == (pytest.approx(0.5 / (0.5 + EPS)), None, pytest.approx(-up))
    assert group_relative_values([1.0, 0.0], eps=0.5) == pytest.approx([0.5, -0.5])


def test_a_group_without_variance_is_exactly_zero():
    # seven scores of 0.1: polars' std is 1.4e-17, not 0; "std > 0" gave +-1e-11 advantages
    assert pl.Series([0.1] * 7).std(ddof=0) > 0
    assert group_relative_values([0.1] * 7) == [0.0] * 7
    assert group_relative_values([2.0]) == [0.0]  # a group of one
    assert group_relative_values([None, None]) == [None, None]
    assert group_relative_values([]) == []


def test_where_the_two_copies_disagreed_a_tiny_spread():
    # scores 0 and 1e-6: mean 5e-7, std 5e-7. judging.prm divided by the std alone (+-1, a
    # full-size signal out of noise); training added eps (+-1/3). One rule now: +-1/3.
    assert group_relative_values([0.0, 1e-6]) == pytest.approx([-1 / 3, 1 / 3], rel=1e-9)


def test_groups_over_columns():
    frame = pl.DataFrame({"g": ["a", "a", "b", "b", "c"], "x": [1.0, 3.0, 5.0, 5.0, 9.0]})
    out = frame.select(
        group_relative(pl.col("x"), ["g"]).alias("adv"), varies(pl.col("x"), ["g"]).alias("v")
    )
    assert out["adv"].to_list() == pytest.approx([-1 / (1 + EPS), 1 / (1 + EPS), 0, 0, 0])
    assert out["v"].to_list() == [True, True, False, False, False]
