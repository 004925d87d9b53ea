"""Property-based test of the Online-Mind2Web folder reader: any result.json gives a parsed
folder or a MalformedFolder with a reason, never another exception."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests import hypothesis_profiles
from warehouse import images
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


# each example writes a folder: keep the test well under 20 s
@settings(max_examples=hypothesis_profiles.examples(60))
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


# -- schema v2: step objects, any screenshot reference -------------------------------------------

shot_refs = st.one_of(
    st.sampled_from(["0.png", "step_1.jpg", "../outside.png", "/etc/passwd", "trajectory/0.png"]),
    st.builds(lambda b: "data:image/png;base64," + b, st.text("AZaz09+/=", max_size=40)),
    st.sampled_from(["data:image/png,rawbytes", "https://example.com/s.png", "HTTP://x"]),
    st.text("ABCDEFabcdef0123456789+/", min_size=60, max_size=120),  # bare base64, not an image
    st.text(max_size=12),
    values,
)
actions = st.one_of(
    st.sampled_from(["a -> CLICK", "TASK_COMPLETE", "TASK_COMPLETE -> ANSWER: x", " "]),
    st.builds(lambda t: "TASK_COMPLETE -> ANSWER: " + t, st.text(max_size=8)),
    values,
)


@st.composite
def v2_steps(draw: st.DrawFn, clean: bool) -> list[dict]:
    """Step objects: ``clean`` ones keep the schema's rules but for their screenshot references
    (any form, good or bad); the others may break any rule."""
    n = draw(st.integers(1 if clean else 0, 4))
    steps = []
    for i in range(n):
        wild = not clean
        step = {
            "step": draw(st.one_of(st.just(i), values)) if wild else i,
            "screenshot": draw(shot_refs) if wild else draw(shot_refs.filter(_nonblank)),
            "action": draw(actions) if wild else draw(st.sampled_from(["a -> CLICK", "b|c"])),
            "url": draw(st.one_of(st.none(), st.text(max_size=10), *([values] if wild else []))),
            "action_status": draw(st.one_of(st.none(), st.sampled_from(["SUCCESS", "FAILED"]))),
        }
        if clean or draw(st.booleans()) or i == 0:
            step["thought"] = draw(st.one_of(st.none(), st.text(max_size=8)))
        steps.append(step)
    if steps and (clean or draw(st.booleans())):
        steps[-1]["action"] = "TASK_COMPLETE -> ANSWER: x"
    return steps


def _nonblank(ref: object) -> bool:
    return isinstance(ref, str) and bool(ref.strip())


@st.composite
def v2_results(draw: st.DrawFn) -> dict:
    clean = draw(st.booleans())
    result = {
        "schema_version": "online-mind2web-v2",
        "task_id": "t1" if clean else draw(st.one_of(st.just("t1"), values)),
        "task": "Find x" if clean else draw(st.one_of(st.just("Find x"), values)),
        "action_history": draw(v2_steps(clean) if clean else st.one_of(v2_steps(False), values)),
        "agent_final_answer": " x " if clean else draw(st.one_of(st.just("x"), values)),
    }
    if draw(st.booleans()):
        result["reference_length"] = draw(st.integers(0, 30) if clean else values)
    return result


@settings(max_examples=hypothesis_profiles.examples(60))
@given(v2_results(), st.binary(max_size=40))
def test_any_v2_result_json_gives_a_folder_or_a_reason(result: dict, shot_bytes: bytes):
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d) / "task"
        (folder / "trajectory").mkdir(parents=True)
        (folder / "result.json").write_text(json.dumps(result))
        for name in ("0.png", "step_1.jpg"):
            (folder / "trajectory" / name).write_bytes(shot_bytes)
        (Path(d) / "outside.png").write_bytes(b"outside the task folder")
        try:
            parsed = parse_folder(folder, Path(d))
        except MalformedFolder as exc:
            assert str(exc).startswith("result.json")
            return
        base = folder.resolve()
        assert parsed.v2 is not None
        assert len(parsed.screenshots) == len(parsed.v2.shots) == len(parsed.actions) + 1
        assert all(isinstance(a, str) and a.strip() for a in parsed.actions)
        assert parsed.answer is None or isinstance(parsed.answer, str)
        for shot in parsed.screenshots:  # never a file outside the task folder
            assert shot.path is None or base in shot.path.parents
            assert (shot.path, shot.data).count(None) >= 1
            if shot.data is not None:
                assert isinstance(images.validate_image(shot.data), str | None)
