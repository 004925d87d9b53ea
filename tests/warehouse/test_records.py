"""Every record type round-trips through the warehouse unchanged."""

from __future__ import annotations

import dataclasses
import datetime as dt
import typing

import polars as pl
import pytest

from warehouse import Warehouse
from warehouse.records import (
    RECORD_TYPES,
    Step,
    Trajectory,
    _base_type,
    conform,
    from_frame,
    to_frame,
)


def full_instance(cls, seed: int = 1):
    """An instance with every field set to a non-default, type-appropriate value."""
    hints = typing.get_type_hints(cls)
    values = {}
    for i, f in enumerate(dataclasses.fields(cls)):
        base = _base_type(hints[f.name])
        if base is str:
            values[f.name] = f"{f.name}-{seed}-ünïcode ✓ 'quote'"
        elif base is int:
            values[f.name] = seed * 100 + i
        elif base is float:
            values[f.name] = seed + i / 8
        elif base is bool:
            values[f.name] = True
        elif base is dt.datetime:
            values[f.name] = dt.datetime(2026, 1, 2, 3, 4, 5, 678000 + i, tzinfo=dt.UTC)
        else:  # JSON
            values[f.name] = {"k": [seed, i, "x"], "nested": {"ok": True}}
    return cls(**values)


@pytest.mark.parametrize("cls", RECORD_TYPES, ids=lambda c: c.TABLE)
def test_every_record_round_trips(wh: Warehouse, cls):
    original = [full_instance(cls, 1), full_instance(cls, 2)]
    result = wh.write(original)
    assert result.inserted == 2
    back = wh.records(cls)
    key = lambda r: tuple(str(getattr(r, k)) for k in cls.KEY)  # noqa: E731
    assert sorted(back, key=key) == sorted(original, key=key)


def test_frames_round_trip_without_the_database():
    recs = [full_instance(Step, 3), Step(traj_id="t", step_idx=0)]
    frame = to_frame(recs)
    assert frame.schema["created_at"] == pl.Datetime("us", "UTC")
    assert from_frame(Step, frame) == recs


def test_conform_fills_missing_columns_and_rejects_unknown_ones():
    frame = conform(Step, pl.DataFrame({"traj_id": ["a"], "step_idx": [0]}))
    assert frame.columns == [f.name for f in dataclasses.fields(Step)]
    assert frame["url"].to_list() == [None]
    with pytest.raises(ValueError, match="unknown columns"):
        conform(Step, pl.DataFrame({"traj_id": ["a"], "step_idx": [0], "oops": [1]}))
    with pytest.raises(ValueError, match="key columns missing"):
        conform(Trajectory, pl.DataFrame({"run_id": ["r"]}))
