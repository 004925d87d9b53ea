"""Property-based tests of the judge reply parsers: any model reply gives a verdict (or key
points, a relevance score, a PRM score) or a judge error — never another exception."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from judging.base import JudgeError
from judging.prm import parse_score
from judging.rubric_vlm import parse_key_points, parse_relevance, parse_verdict
from tests import hypothesis_profiles

hypothesis_profiles.load()

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)
verdict_objects = st.fixed_dictionaries(
    {"verdict": st.sampled_from(["success", "failure", "Success", " FAILURE ", "maybe", 1])},
    optional={
        "criteria": st.one_of(
            json_values,
            st.lists(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "key_point": json_values,
                        "passed": st.one_of(json_values, st.sampled_from(["yes", "fail"])),
                        "reason": json_values,
                    },
                ),
                max_size=4,
            ),
        ),
        "rationale": json_values,
    },
)
replies = st.one_of(
    st.text(),
    verdict_objects.map(json.dumps),
    st.tuples(st.text(max_size=30), verdict_objects, st.text(max_size=30)).map(
        lambda t: f"{t[0]}```json\n{json.dumps(t[1])}\n```{t[2]}"
    ),
    st.tuples(st.text(max_size=30), st.sampled_from(["success", "failure", "partial"])).map(
        lambda t: f"Thoughts: {t[0]}\nStatus: {t[1]}"
    ),
)


@given(replies, st.lists(st.text(max_size=10), max_size=3))
@example('{"verdict": ' + "[" * 5000, [])
@example('{"verdict": "success", "criteria": [' + "{" * 3000, ["a"])
@example('{"verdict": "success", "criteria": [{"passed": "maybe"}]}', [])
def test_any_reply_gives_a_verdict_or_a_judge_error(text: str, points: list[str]):
    try:
        verdict, criteria, rationale = parse_verdict(text, points)
    except JudgeError as exc:
        assert str(exc)
        return
    assert verdict in ("success", "failure")
    assert isinstance(criteria, list) and isinstance(rationale, str)
    for c in criteria:
        passed = c["passed"] if isinstance(c, dict) else c.passed
        assert isinstance(passed, bool)


@given(st.text())
@example("1. " + "x" * 10_000)
def test_any_reply_gives_key_points_or_a_judge_error(text: str):
    try:
        points = parse_key_points(text)
    except JudgeError:
        return
    assert 1 <= len(points) <= 12 and all(p.strip() for p in points)


@given(st.text())
@example("Score: ５")
def test_any_reply_gives_a_relevance_or_a_judge_error(text: str):
    try:
        score = parse_relevance(text)
    except JudgeError:
        return
    assert score in (1, 2, 3, 4, 5)


@given(st.one_of(st.text(), st.from_regex(r"[Ss]core\s*[:=]\s*\**\s*[0-9٣]{1,3}(\.[0-9]+)?")))
@example("Score: 10.5")
@example("score = ١٠")
def test_any_reply_gives_a_prm_score_or_a_value_error(text: str):
    """The PRM scorer turns a ValueError into a stored scorer error."""
    try:
        score = parse_score(text)
    except ValueError as exc:
        assert "Score: N" in str(exc)
        return
    assert 0.0 <= score <= 1.0


@pytest.mark.parametrize(("text", "score"), [("Score: 7", 0.7), ("**Score:** 10", 1.0)])
def test_prm_scores(text: str, score: float):
    assert parse_score(text) == score
