"""The ranker's prompt parsing (:mod:`rollouts.ranker.prompt`): it reads back what the shared
prompt builder wrote, and refuses anything else."""

from __future__ import annotations

import pytest

from rollouts.prompts import PromptConfig, Turn, build_messages, render
from rollouts.ranker.prompt import NotAWebloopPrompt, parse_prompt
from tests.rollouts.ranker.fixture import INSTRUCTION, TREE, messages


def test_parse_prompt_reads_what_build_messages_wrote() -> None:
    msgs = messages(["click(e35)", 'type(e11, "Mia")'], error="boom")
    for form in (msgs, render(msgs)):
        inp = parse_prompt(form)
        assert inp.instruction == INSTRUCTION
        assert inp.history == ("click(e35)", 'type(e11, "Mia")')
        assert inp.failed == (True, True)
        assert inp.title == "Farefinder — search"  # a title holding " — " keeps it
        assert inp.url == "http://127.0.0.1:5/flights?x=1"
        assert inp.tree == TREE
        assert inp.targets == ('link "Select"', 'textbox "From"')  # named in the lines
        assert inp.pages == ("Farefinder — search",) * 2 and inp.on_this_page(0)
    none = parse_prompt(messages())
    assert none.history == () and none.failed == ()
    both = build_messages("Do it", [Turn("u", "T", screenshot=b"png", a11y="- button")])
    assert parse_prompt(both).tree == "- button"
    shot = build_messages("Do it", [Turn("u", "T", screenshot=b"png", a11y="- x")],
                          PromptConfig(mode="screenshot"))  # fmt: skip
    assert parse_prompt(shot).tree == ""
    with pytest.raises(NotAWebloopPrompt, match="system"):
        parse_prompt([{"role": "user", "content": "Task: x"}])
    with pytest.raises(NotAWebloopPrompt, match="JSON"):
        parse_prompt("not json")


def test_history_notes_are_parsed_back_and_format_one_lines_still_read() -> None:
    """A page title holding the note's own markers does not move the action's end; a
    format-1 line (no note) names no page, and its refs count as this page's."""
    tricky = 'Q  # on page "x"  (failed: no)'
    inp = parse_prompt(messages(["click(e35)"], error="boom", page=("http://h/a", tricky)))
    assert inp.history == ("click(e35)",) and inp.failed == (True,)
    assert inp.pages == (tricky,) and not inp.on_this_page(0)
    v1 = messages()
    text = v1[1]["content"][0]["text"].replace(
        "Previous actions: none", "Previous actions:\n1. click(e20)\n2. scroll(down)  (failed: x)"
    )
    old = parse_prompt([v1[0], {"role": "user", "content": text}])
    assert old.history == ("click(e20)", "scroll(down)") and old.failed == (False, True)
    assert old.pages == (None, None) and old.on_this_page(1) and old.targets == ("", "")
