"""The action grammar: canonical round trip, parsing from free model output, clear errors."""

from __future__ import annotations

import pytest

from rollouts.actions import (
    Answer,
    Click,
    ParseError,
    Scroll,
    Target,
    Type,
    format_action,
    parse_action,
    to_dict,
)

CANONICAL = [
    "click(120, 340)",
    "click(e12)",
    "click([7])",
    'click(css="#add-to-cart")',
    'type("héllo \\"quoted\\" ✓")',
    'type(css="#q", "lamp")',
    'type(e3, "x")',
    'press("Enter")',
    "scroll(down)",
    "scroll(0, 250)",
    'scroll(css="#list", up)',
    'select(css="#color", "Red")',
    'goto("http://127.0.0.1:8000/search?q=a&b=c")',
    "back()",
    "wait()",
    "wait(2.5)",
    'answer("$12.50")',
    "click(css=\"a[href='/message/m003']\")",
]


@pytest.mark.parametrize("text", CANONICAL)
def test_canonical_round_trip(text):
    action = parse_action(text)
    assert not isinstance(action, ParseError), action
    assert format_action(action) == text
    assert parse_action(format_action(action)) == action


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (
            "Thought: the search box is at the top.\nAction: type(css='#q', 'lamp')",
            Type("lamp", Target(selector="#q")),
        ),
        ("I will click it.\nAction: ```click(e5)```", Click(Target(ref="e5"))),
        ("Let me think: click(1, 2) looks wrong.\nAction: click(3, 4)", Click(Target(x=3, y=4))),
        ("no marker, last call wins: scroll(down)", Scroll(0, 600)),
        (
            "Action: answer('It costs $5, I think (roughly).')",
            Answer("It costs $5, I think (roughly)."),
        ),
    ],
)
def test_parse_from_free_output(output, expected):
    assert parse_action(output) == expected


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        ("", "empty output"),
        ("I am not sure what to do.", "no action found"),
        ("Action: click()", "click needs one target"),
        ("Action: type(e1)", "type needs a quoted text"),
        ("Action: scroll(sideways)", "scroll needs a direction"),
        ("Action: goto(home)", "goto needs a quoted URL"),
    ],
)
def test_unparseable_output_is_a_typed_error(output, reason):
    result = parse_action(output)
    assert isinstance(result, ParseError)
    assert reason in result.reason


def test_to_dict_is_json_shaped():
    assert to_dict(parse_action('select(css="#c", "Red")')) == {
        "type": "select",
        "target": {"selector": "#c"},
        "value": "Red",
    }


def test_a_target_is_exactly_one_thing():
    with pytest.raises(ValueError):
        Target(x=1, y=2, ref="e1")
    with pytest.raises(ValueError):
        Target(x=1)
