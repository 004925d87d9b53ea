"""Task templates: what one generated task is (:class:`TaskSpec`), the registry of templates,
and helpers that write reference solutions in webloop's action grammar.

Each site module (``sites/shop.py``, ``travel.py``, ``wiki.py``, ``mail.py``) defines its own
templates with ``@template("name")``: a template draws one instance from the site content with a
seeded RNG and returns a :class:`TaskSpec`, or None when the draw has no answer (e.g. no such
flight). The reference solution uses CSS targets, so a scripted expert can execute it; its
length is the task's difficulty. :mod:`sites.tasks` turns specs into warehouse tasks.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sites.content import Content


@dataclass(frozen=True)
class TaskSpec:
    """One drawn task, before it becomes a warehouse :class:`~warehouse.records.Task`."""

    template: str  # the template's registered name
    site: str  # shop | travel | wiki | mail
    instruction: str  # what the agent is told
    start_path: str  # path on the site where the episode starts
    rubric: list[str]  # key points, for rubric judges
    checker: dict[str, Any]  # a spec for sites.checkers.check
    reference: list[str]  # an expert solution in the action grammar (its length: difficulty)
    params: dict[str, Any] = field(default_factory=dict)  # what the template drew


# -- grammar helpers (canonical text, as rollouts.actions.format_action prints it) -------------


def _q(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def click(sel: str) -> str:
    return f"click(css={_q(sel)})"


def type_(sel: str, text: str) -> str:
    return f"type(css={_q(sel)}, {_q(text)})"


def select(sel: str, value: str) -> str:
    return f"select(css={_q(sel)}, {_q(value)})"


def answer(text: str) -> str:
    return f"answer({_q(text)})"


ACCEPT_COOKIES = click("#accept-cookies")
TEMPLATES: dict[str, Callable[[Content, random.Random], TaskSpec | None]] = {}
#: The bundled suite version each template joined in (``sites.tasks.generate`` draws a suite
#: version's templates only, so an earlier version's tasks stay what they were).
SINCE: dict[str, int] = {}


def template(name: str, since: int = 2):
    """Register a template ``(content, rng) → TaskSpec | None`` under ``name``, part of the
    bundled suite from version ``since`` on."""

    def deco(fn):
        TEMPLATES[name] = fn
        SINCE[name] = since
        return fn

    return deco
