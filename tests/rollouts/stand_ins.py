"""Stand-ins for paid models (which cannot run here), as real local OpenAI-protocol servers."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from tests.rollouts.fake_openai import FakeOpenAI, last_user_text


def stand_in() -> FakeOpenAI:
    """Judge, PRM and teacher in one OpenAI-protocol server: the rubric judge's verdicts
    alternate per task (success first: every GRPO group of two has a learning signal), its
    key points are one line, every screenshot is 3/5 relevant; the PRM scores 7/10; the teacher
    answers with the reference solution's first action."""
    seen: Counter[str] = Counter()

    def reply(body: dict[str, Any]) -> str:
        text = last_user_text(body)
        if "List the key points" in text:
            return "1. do what the task asks"
        if "Rate it." in text:
            return "Score: 7"
        if "How much evidence does it show" in text:  # the judge's screenshot relevance
            return "Score: 3"
        if "You are now the TEACHER" in text:
            first = re.search(r"reference solution[^\n]*\n1\. ([^\n]+)", text)
            action = first.group(1) if first else 'answer("done")'
            return f"Error: step 1: it strayed\nThought: follow the plan\nAction: {action}"
        task = re.search(r"Task: (.*)", text)
        seen[task.group(1) if task else ""] += 1
        verdict = "success" if seen[task.group(1) if task else ""] % 2 else "failure"
        return json.dumps({"verdict": verdict})

    return FakeOpenAI([], default=("fn", reply))
