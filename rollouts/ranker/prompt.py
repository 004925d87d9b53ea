"""The ranker's input: a webloop prompt parsed back into what the ranker reads.

The prompt is exactly the text the shared prompt builder (:func:`rollouts.prompts.build_messages`)
writes, mode ``a11y`` or ``both``, as chat messages or their :func:`~rollouts.prompts.render`
text. :func:`parse_prompt` reads the instruction, the previous actions (and whether each
failed), the current page's title and URL and its accessibility tree; anything else raises
:class:`NotAWebloopPrompt`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollouts.prompts import SYSTEM_PROMPT


class NotAWebloopPrompt(ValueError):
    """Text that is not a prompt of :func:`rollouts.prompts.build_messages`."""


@dataclass(frozen=True)
class RankerInput:
    """What the ranker reads from a prompt.

    ``instruction``: the task. ``history``: the previous action lines as written (``"click(e3)"``,
    a failure note stripped), ``failed``: whether each failed. ``title``/``url``: the current
    page. ``tree``: the accessibility-tree text (``""`` when the prompt has none)."""

    instruction: str
    history: tuple[str, ...]
    failed: tuple[bool, ...]
    title: str
    url: str
    tree: str

    @staticmethod
    def parse(prompt: str | Sequence[dict[str, Any]]) -> RankerInput:
        return parse_prompt(prompt)


_HISTORY = re.compile(r"^\d+\. (.*?)(  \(failed: .*\))?$")


def _user_text(messages: Sequence[dict[str, Any]]) -> str:
    if not messages or not all(isinstance(m, dict) for m in messages):
        raise NotAWebloopPrompt("a webloop prompt is a list of chat messages")
    system = next((m for m in messages if m.get("role") == "system"), None)
    if system is None or not str(system.get("content", "")).startswith(SYSTEM_PROMPT[:40]):
        raise NotAWebloopPrompt("the prompt has no webloop system message")
    user = next((m for m in messages if m.get("role") == "user"), None)
    content = user.get("content") if user else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        ]
        if texts:
            return texts[0]
    raise NotAWebloopPrompt("the prompt has no user text")


def parse_prompt(prompt: str | Sequence[dict[str, Any]]) -> RankerInput:
    """Parse the user message :func:`rollouts.prompts.build_messages` writes (messages, or their
    :func:`~rollouts.prompts.render` text). Raises :class:`NotAWebloopPrompt` otherwise."""
    if isinstance(prompt, str):
        try:
            prompt = json.loads(prompt)
        except json.JSONDecodeError as exc:
            raise NotAWebloopPrompt(f"the prompt is not rendered JSON messages ({exc})") from exc
        if not isinstance(prompt, list):
            raise NotAWebloopPrompt("the rendered prompt is not a list of messages")
    text = _user_text(prompt)
    if not text.startswith("Task: "):
        raise NotAWebloopPrompt("the user message does not start with 'Task: '")
    head, _, rest = text.partition("\n\nAccessibility tree of the current page")
    tree = ""
    if rest:
        m = re.search(r"<page>\n(.*)\n</page>", rest, re.S)
        tree = m.group(1) if m else ""
    lines = head.split("\n")
    instruction = lines[0][len("Task: ") :]
    history, failed = [], []
    title = url = ""
    for line in lines[1:]:
        if line.startswith("Current page: "):
            page = line[len("Current page: ") :]
            title, _, url = page.rpartition(" — ")
            continue
        m = _HISTORY.match(line)
        if m and not url:
            history.append(m.group(1))
            failed.append(m.group(2) is not None)
    return RankerInput(instruction, tuple(history), tuple(failed), title, url, tree)


def prompt_key(prompt: str) -> str:
    """The cache key of a rendered prompt."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()
