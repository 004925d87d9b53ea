"""Property-based tests of the action parser: any text gives an action or a ParseError (never
another exception), and printing then parsing an action gives the same action back."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from rollouts.actions import (
    Action,
    Answer,
    Back,
    Click,
    Goto,
    ParseError,
    Press,
    Scroll,
    Select,
    Target,
    Type,
    Wait,
    format_action,
    parse_action,
)
from tests import hypothesis_profiles

hypothesis_profiles.load()

ACTION_TYPES = (Click, Type, Press, Scroll, Select, Goto, Back, Wait, Answer)

numbers = st.one_of(
    st.integers(-100_000, 100_000).map(float),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
)
texts = st.text(max_size=40)
xy = st.builds(lambda x, y: Target(x=x, y=y), numbers, numbers)
ref = st.from_regex(r"(f[0-9]{1,3})?e[0-9]{1,5}", fullmatch=True).map(lambda r: Target(ref=r))
mark = st.integers(0, 10**6).map(lambda m: Target(mark=m))
css = texts.map(lambda s: Target(selector=s))
targets = st.one_of(xy, ref, mark, css)

actions: st.SearchStrategy[Action] = st.one_of(
    st.builds(Click, targets),
    st.builds(Type, texts, st.none() | targets),
    st.builds(Press, texts),
    st.builds(Scroll, numbers, numbers, st.none() | targets),
    st.builds(Select, targets, texts),
    st.builds(Goto, texts),
    st.just(Back()),
    st.builds(Wait, numbers),
    st.builds(Answer, texts),
)


def _call_like() -> st.SearchStrategy[str]:
    """Text that looks like the grammar: verbs, brackets, quotes, numbers, JSON pieces."""
    pieces = st.sampled_from(
        [
            "click",
            "type",
            "scroll",
            "select",
            "answer",
            "wait",
            "goto",
            "press",
            "back",
            "(",
            ")",
            ",",
            '"',
            "'",
            "“",
            "[",
            "]",
            "{",
            "}",
            ":",
            "=",
            "css=",
            "e12",
            "-3.5",
            "1e5",
            "down",
            "Action:",
            "```",
            "\\",
            "\n",
            " ",
            '"action"',
            '"x"',
            '"coordinate"',
            '"mark"',
            "null",
            "[1, 2]",
            '["a", "b"]',
            "{}",
            "٣",
        ]
    )
    return st.lists(pieces, max_size=25).map("".join)


@given(st.one_of(st.text(), _call_like()))
@example('{"action": "click", "coordinate": ["a", 1]}')
@example('{"action": "click", "coordinate": [{}, 1]}')
@example('{"action": "click", "mark": "three"}')
@example('{"action": "click", "mark": 1.5e400}')
@example('{"action": "scroll", "dx": 1e400}')
@example('{"action": "wait", "seconds": 1e400}')
@example("click(1e5, 2)")
@example("[" * 5000 + "]" * 5000)
@example("{" * 3000)
@example('{"action": ' * 1000)
def test_any_text_parses_to_an_action_or_a_parse_error(text: str):
    out = parse_action(text)
    assert isinstance(out, (ParseError, *ACTION_TYPES))
    if isinstance(out, ParseError):
        assert out.reason
    with_bounds = parse_action(text, bounds=(1280, 720))
    assert isinstance(with_bounds, (ParseError, *ACTION_TYPES))


@given(actions)
@example(Answer("click(1, 2)"))
@example(Type("Action: click(1, 2)"))
@example(Answer('{"action": "back"}'))
@example(Click(Target(x=1e-05, y=2.5e20)))
@example(Scroll(600.0, 0.0, Target(x=10.0, y=20.0)))
@example(Scroll(1.0, 2.0, Target(x=10.0, y=20.0)))
def test_parse_of_format_is_the_identity(action: Action):
    text = format_action(action)
    assert parse_action(text) == action, text
    assert parse_action(f"I will act now.\nAction: {text}") == action, text


@given(actions, texts)
def test_the_last_action_line_wins(action: Action, prose: str):
    prose = prose.replace("ction", "")  # keep 'Action:' markers out of the reasoning
    text = f"Thought: {prose}\nAction: {format_action(action)}"
    out = parse_action(text)
    assert out == action, text


def test_non_finite_numbers_are_a_parse_error():
    for text in ('{"action": "click", "x": 1e400, "y": 2}', "click(1e400, 2)", "wait(1e999)"):
        out = parse_action(text)
        assert isinstance(out, ParseError), text
        assert "finite" in out.reason or "out of range" in out.reason


def test_an_action_marker_inside_a_json_string_keeps_the_json_action():
    out = parse_action('{"thought": "Next Action: click it", "action": "back"}')
    assert out == Back()
