"""Frames of in-memory rows (``warehouse.frames``): what the CLI prints as table, CSV, JSON."""

from __future__ import annotations

import polars as pl

from warehouse.frames import rows_frame


def test_rows_frame_keeps_column_order_and_values():
    df = rows_frame([{"b": "x", "a": 1, "f": 0.5}, {"b": None, "a": 2, "f": None}])
    assert df.columns == ["b", "a", "f"]
    assert list(df.iter_rows()) == [("x", 1, 0.5), (None, 2, None)]
    assert df.write_csv() == "b,a,f\nx,1,0.5\n,2,\n"
    assert df.write_json() == '[{"b":"x","a":1,"f":0.5},{"b":null,"a":2,"f":null}]'


def test_text_rows_frame_types_every_column_as_text():
    df = rows_frame([{"what": "snapshot", "a": None, "n": "3"}], text=True)
    assert df.schema == {"what": pl.String, "a": pl.String, "n": pl.String}
    assert df.write_json() == '[{"what":"snapshot","a":null,"n":"3"}]'
    assert rows_frame([], text=True).columns == []
