"""Property-based test of the Online-Mind2Web folder reader: any result.json gives a parsed
folder or a MalformedFolder with a reason, never another exception."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests import hypothesis_profiles
from warehouse.interop.om2w import MalformedFolder, parse_folder

hypothesis_profiles.load()

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)
results = st.dictionaries(
    st.sampled_from(
        [
            "task_id",
            "task",
            "final_result_response",
            "action_history",
            "thoughts",
            "website",
            "webloop",
        ]
    ),
    st.one_of(
        values,
        st.fixed_dictionaries({}, optional={"sample_idx": values}),
        st.lists(st.text(max_size=10) | st.none(), max_size=4),
    ),
    max_size=7,
)
contents = st.one_of(
    results.map(lambda d: json.dumps(d).encode()),
    values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=60),
)


@settings(max_examples=60)  # each example writes a folder: keep the test well under 20 s
@given(contents, st.lists(st.sampled_from(["0.png", "step_1.jpg", "a.png", "10.webp"]), max_size=3))
@example(b"[" * 5000, ["0.png"])
@example(b'{"task_id": "t", "task": "x", "webloop": {"sample_idx": 1e400}}', [])
@example(b'{"task_id": "t", "task": "x", "webloop": {"sample_idx": "1"}}', [])
@example(b'{"task_id": "t", "task": "x", "action_history": [' + b"[" * 3000, [])
def test_any_result_json_gives_a_folder_or_a_reason(content: bytes, shots: list[str]):
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d) / "task"
        (folder / "trajectory").mkdir(parents=True)
        (folder / "result.json").write_bytes(content)
        for name in shots:
            (folder / "trajectory" / name).write_bytes(b"not an image")
        try:
            parsed = parse_folder(folder, Path(d))
        except MalformedFolder as exc:
            assert str(exc)
            return
    assert parsed.task_id.strip() and parsed.task.strip()
    assert all(isinstance(a, str) for a in parsed.actions + parsed.thoughts)
    assert parsed.answer is None or isinstance(parsed.answer, str)
    assert isinstance(parsed.sample_idx, int) and parsed.sample_idx >= 0
    assert [s.name for s in parsed.screenshots] == sorted(
        (n for n in set(shots) if n != "a.png"), key=lambda n: int("".join(filter(str.isdigit, n)))
    )
