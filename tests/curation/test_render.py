"""Rendering a stored trajectory's targets (:mod:`curation.render`): replies, running summaries
and the expert's targets. The prompts themselves are checked byte for byte against what the
engine stored in :mod:`tests.curation.test_examples`."""

from __future__ import annotations

from curation.render import expert_policy, reply, summaries


def test_a_target_is_written_as_a_model_reply():
    assert reply("click(e1)", "why") == "Thought: why\nAction: click(e1)"
    assert reply("click(e1)") == "Action: click(e1)"


def test_the_running_summary_is_the_last_one_of_the_earlier_outputs():
    assert summaries(["a\nSummary: one", "b", "Summary: two", "c"]) == [None, "one", "one", "two"]


def test_the_expert_is_known_by_its_policy_name():
    assert expert_policy("expert") and not expert_policy("openai")
