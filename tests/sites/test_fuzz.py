"""Property-based tests of the task importers: any file content gives tasks and per-row errors
(every row accounted for), never another exception."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from tests import hypothesis_profiles
from warehouse.connection import WarehouseError
from warehouse.interop.task_formats import FORMATS, parse_task_file
from warehouse.records import Task

hypothesis_profiles.load()

KEYS = [
    "task_id",
    "id",
    "annotation_id",
    "confirmed_task",
    "task",
    "instruction",
    "ques",
    "question",
    "website",
    "start_url",
    "web",
    "url",
    "web_name",
    "reference_length",
    "level",
    "rubric",
    "reference",
    "site",
    "split",
    "suite",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["https://a.example/", "www.b.example", "http://[::1", "https://", "7"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
rows = st.one_of(st.dictionaries(st.sampled_from(KEYS), json_values, max_size=8), json_values)


def _parse(fmt: str, content: bytes):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "tasks.json"
        p.write_bytes(content)
        return parse_task_file(fmt, p)


def _check(parsed, n_rows: int | None = None) -> None:
    assert all(isinstance(t, Task) and t.task_id and t.instruction for t in parsed.tasks)
    assert all(t.start_url.startswith(("http://", "https://")) for t in parsed.tasks)
    assert all(isinstance(n, int) and isinstance(why, str) and why for n, why in parsed.errors)
    if n_rows is not None:
        assert len(parsed.tasks) + len(parsed.errors) == max(n_rows, 1)


@given(st.sampled_from(sorted(FORMATS)), st.lists(rows, max_size=5))
@example("om2w", [{"website": "http://[::1", "confirmed_task": "x"}])
@example("webvoyager", [{"web": "https://a.example/", "ques": "q", "id": True}])
@example("rubric", [{"instruction": "i", "start_url": "https://a/", "rubric": "r", "reference": 1}])
def test_any_json_rows_give_tasks_or_row_errors(fmt: str, items: list):
    _check(_parse(fmt, json.dumps(items).encode()), len(items))
    _check(_parse(fmt, json.dumps(items, indent=1).encode() + b"\n"), len(items))
    jsonl = "\n".join(json.dumps(r) for r in items).encode()
    # one line holding an array (or {"tasks": [...]}) reads as that array: the same bytes
    one_array = len(items) == 1 and (
        isinstance(items[0], list)
        or (
            isinstance(items[0], dict)
            and any(
                isinstance(items[0].get(k), list) for k in ("tasks", "data", "examples", "items")
            )
        )
    )
    got = _parse(fmt, b"\xef\xbb\xbf" + jsonl)
    _check(got, None if one_array else len(items))
    if one_array:  # the same rows as that array given as the whole file
        whole = _parse(fmt, json.dumps(items[0]).encode())
        assert (len(got.tasks), len(got.errors)) == (len(whole.tasks), len(whole.errors))


@given(st.sampled_from(sorted(FORMATS)), st.binary(max_size=200) | st.text(max_size=200))
@example("om2w", "[" * 3000)
@example("om2w", '{"tasks": [' + "[" * 3000)
@example("webvoyager", "[{},")
@example("rubric", "[1 2]")
def test_any_bytes_give_tasks_row_errors_or_one_file_error(fmt: str, content: bytes | str):
    raw = content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content
    try:
        parsed = _parse(fmt, raw)
    except WarehouseError as exc:
        assert "UTF-8" in str(exc)
        return
    _check(parsed)
