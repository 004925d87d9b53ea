"""The action grammar: canonical round trip, parsing from free model output, clear errors, and
the stored forms read back."""

from __future__ import annotations

import json

import pytest

from rollouts.actions import (
    Answer,
    Click,
    ParseError,
    Scroll,
    Target,
    Type,
    action_from_dict,
    format_action,
    parse_action,
    proposed_action_text,
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


@pytest.mark.parametrize("text", CANONICAL)
def test_stored_dicts_read_back_as_the_same_action(text):
    action = parse_action(text)
    assert action_from_dict(json.loads(json.dumps(to_dict(action)))) == action


def test_stored_action_values_read_back_as_canonical_text():
    assert proposed_action_text({"type": "click", "target": {"ref": "e7"}}) == "click(e7)"
    assert (
        proposed_action_text(json.dumps({"type": "scroll", "dx": 0, "dy": 600})) == "scroll(down)"
    )
    assert proposed_action_text("press('Enter')") == 'press("Enter")'
    assert proposed_action_text({"type": "fly"}) is None
    # the grammar text stored beside the fields (curation.interventions) wins
    assert proposed_action_text({"type": "type", "text": 'type(e2, "kettle")'}) == (
        'type(e2, "kettle")'
    )
    assert proposed_action_text(None) is None and proposed_action_text(3) is None


def test_a_target_is_exactly_one_thing():
    with pytest.raises(ValueError):
        Target(x=1, y=2, ref="e1")
    with pytest.raises(ValueError):
        Target(x=1)


# A corpus of messy, real-world-style model outputs → the action each must parse to.
CORPUS = [
    (
        'Thought: The search field is empty.\nAction: type(e7, "wireless mouse")',
        'type(e7, "wireless mouse")',
    ),
    ("**Thought**: click the button\n**Action**: click(e12)", "click(e12)"),
    ("Action:\n```\nclick(412, 96)\n```", "click(412, 96)"),
    ("Here is my answer.\n```python\nAction: press('Enter')\n```", 'press("Enter")'),
    ("Thought: I'll scroll.\nAction: scroll(down)\nI hope this works!", "scroll(down)"),
    ("ACTION: CLICK(100, 200)", "click(100, 200)"),
    ("Action: click( 100 ,200 )", "click(100, 200)"),
    ("Action: click(100.5, 200.25)", "click(100.5, 200.25)"),
    ("Action: type(“naïve café — 東京”)", 'type("naïve café — 東京")'),
    ("Action: answer('Der Preis beträgt 12,50 €')", 'answer("Der Preis beträgt 12,50 €")'),
    ('Action: answer("He said \\"hi\\" (twice)")', 'answer("He said \\"hi\\" (twice)")'),
    ("Action: click(f1e23)", "click(f1e23)"),
    ("Action: click([ 4 ])", "click([4])"),
    ("Action: click(ref=e5)", "click(e5)"),
    ('Action: select(e9, "Nonstop only")', 'select(e9, "Nonstop only")'),
    ("Action: goto('https://example.com/a?b=c&d=(e)')", 'goto("https://example.com/a?b=c&d=(e)")'),
    ("Action: wait(3)", "wait(3)"),
    ("Action: back()", "back()"),
    ('{"action": "click", "x": 10, "y": 20}', "click(10, 20)"),
    (
        'Thought: ok\n```json\n{"name": "type", "arguments": {"ref": "e3", "text": "héllo"}}\n```',
        'type(e3, "héllo")',
    ),
    ('{"action_type": "left_click", "coordinate": [640, 400]}', "click(640, 400)"),
    ('I will scroll. {"action": "scroll", "direction": "down"}', "scroll(down)"),
    ('{"action": "answer", "text": "42"}', 'answer("42")'),
    ('{"action": {"type": "press", "key": "Tab"}}', 'press("Tab")'),
]


@pytest.mark.parametrize(("output", "canonical"), CORPUS)
def test_messy_outputs(output, canonical):
    action = parse_action(output, bounds=(1280, 800))
    assert not isinstance(action, ParseError), action
    assert format_action(action) == canonical


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        ("Action: click(2000, 10)", "outside the 1280x800 screen"),
        ("Action: click(-5, 10)", "outside"),
        ('{"action": "fly"}', "unknown action 'fly'"),
        ('{"foo": 1}', "no action found"),
        ("Action: type(e1, unquoted words)", "type needs a quoted text"),
        ("Action: click(1, 2", "unbalanced parentheses"),
    ],
)
def test_messy_outputs_that_must_fail(output, reason):
    result = parse_action(output, bounds=(1280, 800))
    assert isinstance(result, ParseError) and reason in result.reason, result


def test_the_closing_label_matches_any_answer_and_nothing_else():
    """Once the reference is exhausted the label is the expert's closing ``answer("done")``:
    stopping with any answer follows it; going on (a click) is the first error there."""
    from rollouts.labeller import CLOSING, matches_label

    assert matches_label('answer("done")', CLOSING)
    assert matches_label('answer("3 items in the cart")', CLOSING)
    assert not matches_label("click(e4)", CLOSING) and not matches_label(None, CLOSING)
    # other labels keep the exact comparison: an answer's text matters there
    assert matches_label("click( e4 )", "click(e4)") and not matches_label("click(e5)", "click(e4)")
    assert not matches_label('answer("Paris")', 'answer("Lyon")')
