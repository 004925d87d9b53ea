"""Reference labels on the learner's own states: the cheapest exact step label a bundled task has.

DAgger needs the expert's action at the states the learner reaches. On a bundled site the task's
reference solution is the expert; while the learner stays on the reference's path, the
reference's next step, grounded on the live page in the learner's action space (``click(e12)``),
IS the right action there — no replay, no extra browser. :class:`ReferenceLabeller` runs a
noise-free shadow of the scripted expert beside the learner in the same episode:

* before each learner action is executed, the shadow grounds the reference's next step on the
  page (its label for the state);
* when the learner's action equals the label (by parsed value), both advance;
* when it differs, that state is the trajectory's *first error* (the first one only) and the
  shadow's cursor stays. If the learner's action left the page as it was (the same URL and
  accessibility tree: a failed click, a no-op), the state is still on the path and labelling
  goes on; otherwise the trajectory has left the path and no later state is labelled (the
  reference's plan no longer says what is right there).

Once the reference is exhausted, the label is the expert's closing ``answer("done")``: a policy
that does not stop there (it adds a fourth item to a three-item cart) makes its first error at
that state. States without a label (off the path, an element the plan names that is not on the
page) get ``None``. The engine stores the labels in the trajectory's
``meta.reference_labels`` (one per step) and the index of the first error in
``meta.first_error``; the PRM's ``reference`` scorer reads them (``webloop score-steps --scorer
reference``).
"""

from __future__ import annotations

import random
import re
from typing import Any

from rollouts.actions import Answer, ParseError, format_action, parse_action
from rollouts.policies import ExpertPolicy, PolicyContext
from rollouts.prompts import Turn

_VOLATILE = re.compile(r" \[(?:ref=(?:f\d+)?e\d+|active|cursor=[\w-]+)\]")


def page_key(url: str | None, a11y: str | None) -> tuple[str, str]:
    """What a state is for the labeller: the URL and the accessibility tree without the marks
    that change while the page does not (refs, focus, cursor)."""
    return url or "", _VOLATILE.sub("", a11y or "")


def same_action(a: str | None, b: str | None) -> bool:
    """Whether two action texts are the same action (compared parsed, so spacing and quoting
    do not matter)."""
    if a is None or b is None:
        return False
    pa, pb = parse_action(a), parse_action(b)
    if isinstance(pa, ParseError) or isinstance(pb, ParseError):
        return a.strip() == b.strip()
    return format_action(pa) == format_action(pb)


#: The label of a state where the reference is exhausted: the expert stops there. Any answer
#: matches it (its text is the expert's placeholder; the task's checker reads the page's state).
CLOSING = 'answer("done")'


def matches_label(action_text: str | None, label: str | None) -> bool:
    """Whether an action is the labelled one: the same action (:func:`same_action`), or any
    answer where the label is the closing :data:`CLOSING`."""
    if label == CLOSING and action_text is not None:
        return isinstance(parse_action(action_text), Answer)
    return same_action(action_text, label)


class ReferenceLabeller:
    """The shadow expert of one episode (see the module's docstring). ``turns``: the episode's
    turn list (the engine's, growing); ``page``: the live page."""

    def __init__(
        self,
        task_id: str,
        instruction: str,
        reference: list[str],
        turns: list[Turn],
        page: Any,
        action_timeout_s: float,
    ) -> None:
        self.expert = ExpertPolicy(noise=0.0, action_space="ref")
        self.ctx = PolicyContext(
            task_id,
            instruction,
            list(reference),
            turns,
            random.Random(0),
            page=page,
            action_timeout_s=action_timeout_s,
        )
        self.on_path = bool(reference) and page is not None
        self.labels: list[str | None] = []
        self.first_error: int | None = None
        self._left: tuple[str, str] | None = None  # the page a mismatched action was taken on
        self._advance: dict[str, Any] | None = None  # the shadow's memory had it acted

    async def label(self, action_text: str | None) -> str | None:
        """Label the current state (before the learner's ``action_text`` runs; None: it did not
        parse) and record whether the learner followed it; the label (None: none)."""
        self._left = None
        label = await self._expert_action() if self.on_path else None
        self.labels.append(label)
        if label is None:
            self.on_path = False
            return None
        if matches_label(action_text, label):
            self._follow()
        else:
            if self.first_error is None:
                self.first_error = len(self.labels) - 1
            turn = self.ctx.turns[-1] if self.ctx.turns else None
            self._left = page_key(turn.url, turn.a11y) if turn is not None else ("", "")
        return label

    def moved(self, url: str | None, a11y: str | None) -> None:
        """After the learner's action ran: a mismatched action that changed the page ends the
        labelling."""
        if self._left is not None and page_key(url, a11y) != self._left:
            self.on_path = False
        self._left = None

    def meta(self, n_steps: int) -> dict[str, Any]:
        """``reference_labels`` (one per step) and ``first_error`` for the trajectory's meta."""
        labels = (self.labels + [None] * n_steps)[:n_steps]
        return {"reference_labels": labels, "first_error": self.first_error}

    async def _expert_action(self) -> str | None:
        """The reference's next step grounded on the page, committing the shadow's cursor only
        when the learner then follows it (the caller's comparison); where the plan is done, the
        expert's closing ``answer("done")`` (stopping is a decision too: a policy that goes on
        after the task is done errs there); None where the plan's element is not on the page."""
        memory = self.ctx.memory
        memory.setdefault("cursor", 0)
        before = dict(memory)
        out = await self.expert.act(self.ctx)
        grounding_failed = memory.pop("grounding_error", None) is not None
        self._advance = dict(memory)
        memory.clear()
        memory.update(before)
        if grounding_failed or isinstance(out.action, ParseError):
            return None
        return format_action(out.action)

    def _follow(self) -> None:
        """The learner took the label: the shadow advances as the expert would have."""
        advanced = self._advance
        if advanced is not None:
            self.ctx.memory.clear()
            self.ctx.memory.update(advanced)
        self._advance = None
