"""The ranker's prompt parsing (:mod:`rollouts.ranker.prompt`): it reads back what the shared
prompt builder wrote, and refuses anything else."""

from __future__ import annotations

import pytest

from rollouts.prompts import PromptConfig, Turn, build_messages, render
from rollouts.ranker.prompt import NotAWebloopPrompt, parse_prompt
from tests.rollouts.ranker.fixture import INSTRUCTION, TREE, messages


def test_parse_prompt_reads_what_build_messages_wrote() -> None:
    msgs = messages(["click(e24)", 'type(e11, "Mia")'], error="boom")
    for form in (msgs, render(msgs)):
        inp = parse_prompt(form)
        assert inp.instruction == INSTRUCTION
        assert inp.history == ("click(e24)", 'type(e11, "Mia")')
        assert inp.failed == (True, True)
        assert inp.title == "Farefinder — search"  # a title holding " — " keeps it
        assert inp.url == "http://127.0.0.1:5/flights?x=1"
        assert inp.tree == TREE
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
