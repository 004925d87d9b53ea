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

    ``instruction``: the task. ``history``: the previous actions as written (``"click(e3)"``,
    the line's note and failure note stripped), ``failed``: whether each failed, ``targets``:
    the element each acted on (``button "Add"``; ``""``: none named), ``pages``: the title of
    the page each was taken on (``None``: a prompt of format 1, whose lines name no page).
    ``title``/``url``: the current page. ``tree``: the accessibility-tree text (``""`` when the
    prompt has none)."""

    instruction: str
    history: tuple[str, ...]
    failed: tuple[bool, ...]
    title: str
    url: str
    tree: str
    targets: tuple[str, ...] = ()
    pages: tuple[str | None, ...] = ()

    def on_this_page(self, i: int) -> bool:
        """Whether history entry ``i`` was taken on the current page (same title): only there do
        its refs name the same elements (a format-1 prompt names no pages: assumed so)."""
        page = self.pages[i] if i < len(self.pages) else None
        return page is None or page == self.title

    @staticmethod
    def parse(prompt: str | Sequence[dict[str, Any]]) -> RankerInput:
        return parse_prompt(prompt)


_QUOTED = r'"(?:[^"\\]|\\.)*"'
_HISTORY = re.compile(
    r"^\d+\. (?P<action>.*?)"
    rf"(?:  # (?:(?P<target>[a-z][\w-]*(?: {_QUOTED})?) )?on page (?P<page>{_QUOTED}))?"
    r"(?P<failed>  \(failed: .*\))?$"
)


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
    history, failed, targets, pages = [], [], [], []
    title = url = ""
    for line in lines[1:]:
        if line.startswith("Current page: "):
            page = line[len("Current page: ") :]
            title, _, url = page.rpartition(" — ")
            continue
        m = _HISTORY.match(line)
        if m and not url:
            history.append(m.group("action"))
            failed.append(m.group("failed") is not None)
            targets.append(m.group("target") or "")
            pages.append(_page(m.group("page")))
    return RankerInput(
        instruction,
        tuple(history),
        tuple(failed),
        title,
        url,
        tree,
        tuple(targets),
        tuple(pages),
    )


def _page(quoted: str | None) -> str | None:
    if quoted is None:
        return None
    try:
        return str(json.loads(quoted))
    except json.JSONDecodeError:
        return quoted[1:-1]


def prompt_key(prompt: str) -> str:
    """The cache key of a rendered prompt."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()
