"""Stand-ins for paid models (which cannot run here), as real local OpenAI-protocol servers."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from typing import Any

from tests.rollouts.fake_openai import FakeOpenAI, last_user_text


def stand_in(hold_verdict: int | None = None) -> FakeOpenAI:
    """Judge, PRM and teacher in one OpenAI-protocol server: the rubric judge's verdicts
    alternate per task (success first: every GRPO group of two has a learning signal), its
    key points are one line, every screenshot is 3/5 relevant; the PRM scores 7/10; the teacher
    answers with the reference solution's first action.

    ``hold_verdict``: the N-th verdict request (1-based) is held: the server sets its
    ``holding`` event and answers only once ``release`` is set (a test kills its client at that
    known point)."""
    seen: Counter[str] = Counter()
    verdicts = 0
    holding, release = threading.Event(), threading.Event()

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
        nonlocal verdicts
        verdicts += 1
        if verdicts == hold_verdict:
            holding.set()
            release.wait(1800)
        name = m.group(1) if (m := re.search(r"Task: (.*)", text)) else ""
        seen[name] += 1
        return json.dumps({"verdict": "success" if seen[name] % 2 else "failure"})

    fake = FakeOpenAI([], default=("fn", reply))
    fake.holding, fake.release = holding, release  # type: ignore[attr-defined]
    return fake
