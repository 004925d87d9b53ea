"""When an episode stops: the rollout engine's stop rules, as pure functions.

After every step the engine (:class:`rollouts.engine.Engine`) asks whether the episode goes on.
A rule returns why it stops — the trajectory's ``meta.ended_by`` — or None to go on:

* after an unparseable action (:func:`after_invalid_action`): ``max_invalid`` of them in a row
  end it as ``"invalid actions"``; else the step budget (``max_steps``, counting every step
  taken, valid or not) ends it as ``"step budget"``;
* after an action the environment ran (:func:`after_action`): the policy's answer ends it
  (:data:`ANSWERED`: graded with its answer, no ``ended_by``); the environment's step budget
  (``truncated``) ends it as ``"step budget"``; with ``max_repeats`` set, the same action taken
  that many times on the same page ends it as ``"repeated action"`` — "the same" by
  :func:`repeat_key`.

Time budgets and failures are not stop rules: a policy over its step timeout or an episode over
its trajectory timeout is aborted by the engine as ``timeout``, a crashed browser or an
unavailable policy as ``infra_error``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from warehouse.blobs import sha256_hex

if TYPE_CHECKING:
    from rollouts.env import Observation
    from warehouse.records import Step

INVALID_ACTIONS = "invalid actions"
STEP_BUDGET = "step budget"
REPEATED_ACTION = "repeated action"
ANSWERED = "answered"  # not an ``ended_by``: the trajectory ends with its answer

_FRAME_REF = re.compile(r"\bf\d+(e\d+)\b")


def after_invalid_action(
    invalid_run: int, n_steps: int, max_invalid: int, max_steps: int
) -> str | None:
    """Why the episode stops after an unparseable action, or None.

    ``invalid_run``: unparseable actions in a row, this one included; ``n_steps``: steps taken,
    this one included. ``"invalid actions"`` when ``invalid_run >= max_invalid``, else
    ``"step budget"`` when ``n_steps >= max_steps``."""
    if invalid_run >= max_invalid:
        return INVALID_ACTIONS
    if n_steps >= max_steps:
        return STEP_BUDGET
    return None


def after_action(
    terminated: bool, truncated: bool, times_here: int, max_repeats: int
) -> str | None:
    """Why the episode stops after the environment ran an action, or None.

    ``terminated``/``truncated``: the environment's (an answer / its step budget);
    ``times_here``: how often this action was taken on this page, this time included (counted
    only when ``max_repeats`` is set; 0: never ends an episode). :data:`ANSWERED` on an answer,
    else ``"step budget"``, else ``"repeated action"`` when ``times_here >= max_repeats``."""
    if terminated:
        return ANSWERED
    if truncated:
        return STEP_BUDGET
    if max_repeats and times_here >= max_repeats:
        return REPEATED_ACTION
    return None


def repeat_key(obs: Observation, step: Step) -> tuple[str | None, ...]:
    """What makes two steps the same action on the same page for ``max_repeats``: the URL, the
    screenshot's hash, the accessibility tree's hash and the action, element refs in both
    without their frame prefix (``f3e12`` → ``e12``: a reload of the same page is the same
    page)."""
    tree = None
    if obs.a11y is not None:
        tree = sha256_hex(_FRAME_REF.sub(r"\1", obs.a11y).encode())
    action = _FRAME_REF.sub(r"\1", step.action_text or "")
    return obs.url, step.screenshot_hash, tree, action
