"""Online-Mind2Web schema v2 (``"schema_version": "online-mind2web-v2"``): reading and writing.

What the upstream judge (``src/run.py`` of OSU-NLP-Group/Online-Mind2Web) and current agent
harnesses write per task folder::

    result.json  {"schema_version": "online-mind2web-v2", "task_id", "task",
                  "reference_length": int, "agent_final_answer": str | null,
                  "action_history": [{"step": 0, "screenshot": "0000.png", "url": "…",
                                      "action": "button -> CLICK", "action_status": "SUCCESS",
                                      "thought": "…" | null}, …,
                                     {"step": n, …, "action": "TASK_COMPLETE -> ANSWER: …"}]}
    trajectory/  the screenshot files the steps name

A step's ``screenshot`` is a file name under ``trajectory/``, a ``data:`` URI, bare base64 or a
URL. The upstream reader takes every step's action but the last (the last is the agent's
answer, not an action), every step's thought and screenshot, and ``agent_final_answer``.

The rules checked per folder (a folder that breaks one is reported with the reason and not
imported; the other folders are): ``action_history`` is a non-empty list of objects whose
``step`` counts 0, 1, 2, …; every step has a ``thought`` key (null allowed), a non-empty
``action`` string and a ``screenshot`` string; the last step, and only it, is
``TASK_COMPLETE`` (``-> ANSWER: …``), and its answer matches ``agent_final_answer`` up to
whitespace. A screenshot that cannot be read (a URL: webloop fetches nothing on import; bad
base64; a file that is missing, leaves the folder or is no whole image) leaves its step without
a screenshot and is reported; a URL is kept so that an export writes it back.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warehouse import images

SCHEMA = "online-mind2web-v2"
_FINAL = re.compile(r"^\s*TASK_COMPLETE\b\s*(?:->\s*ANSWER:\s?(?P<answer>.*))?\Z", re.S)
_BASE64 = re.compile(r"^[A-Za-z0-9+/\s]+={0,2}\s*$")
_MIN_BASE64 = 64  # shorter strings are file names, not images
_WEB = re.compile(r"^https?://", re.I)


class StepProblem(ValueError):
    """A v2 ``result.json`` that breaks one of the schema's rules (the message says which)."""


@dataclass
class V2Steps:
    """What the steps of a v2 ``result.json`` say: the actions (all but the final step's), and
    per step, the final one included, its thought, URL, status and screenshot reference."""

    actions: list[str]
    thoughts: list[str | None]
    urls: list[str | None]
    statuses: list[str | None]
    shots: list[str]
    answer: str | None
    reference_length: int | None = None


def read_steps(result: dict[str, Any]) -> V2Steps:
    """Check the v2 rules on a parsed ``result.json`` and take its steps, or raise
    :class:`StepProblem` naming the step and key."""
    history = result.get("action_history")
    if not isinstance(history, list) or not history:
        raise StepProblem("'action_history' must be a non-empty list of step objects")
    steps = [_step(i, s) for i, s in enumerate(history)]
    last = len(steps) - 1
    for i, (action, *_rest) in enumerate(steps[:-1]):
        if _FINAL.match(action):
            raise StepProblem(
                f"action_history[{i}]: TASK_COMPLETE before the last step (step {last})"
            )
    final = _FINAL.match(steps[-1][0])
    if final is None:
        raise StepProblem(
            f"action_history[{last}]: the last step's action must be 'TASK_COMPLETE -> "
            f"ANSWER: …', got {steps[-1][0][:80]!r}"
        )
    answer = _answer(result, final.group("answer"))
    return V2Steps(
        actions=[s[0] for s in steps[:-1]],
        thoughts=[s[1] for s in steps],
        urls=[s[2] for s in steps],
        statuses=[s[3] for s in steps],
        shots=[s[4] for s in steps],
        answer=answer,
        reference_length=_reference_length(result),
    )


def _step(i: int, step: Any) -> tuple[str, str | None, str | None, str | None, str]:
    where = f"action_history[{i}]"
    if not isinstance(step, dict):
        raise StepProblem(f"{where} is not a step object")
    n = step.get("step")
    if isinstance(n, bool) or not isinstance(n, int) or n != i:
        raise StepProblem(
            f"{where}: 'step' is {n!r}, expected {i} (steps count 0, 1, 2, … with no gap)"
        )
    if "thought" not in step:
        raise StepProblem(f"{where} has no 'thought' key (null is allowed, absent is not)")
    action = step.get("action")
    if not isinstance(action, str) or not action.strip():
        raise StepProblem(f"{where}: 'action' is missing or not a non-empty string")
    shot = step.get("screenshot")
    if not isinstance(shot, str) or not shot.strip():
        raise StepProblem(f"{where}: 'screenshot' is missing or not a non-empty string")
    return (
        action,
        _optional_text(step, "thought", where),
        _optional_text(step, "url", where) or None,
        _optional_text(step, "action_status", where),
        shot.strip(),
    )


def _optional_text(step: dict[str, Any], key: str, where: str) -> str | None:
    value = step.get(key)
    if value is None or isinstance(value, str):
        return value
    raise StepProblem(f"{where}: '{key}' must be a string or null, got {type(value).__name__}")


def _answer(result: dict[str, Any], final: str | None) -> str | None:
    """``agent_final_answer``, checked against the final step's answer (up to whitespace)."""
    given = result.get("agent_final_answer")
    if given is not None and not isinstance(given, str):
        raise StepProblem("'agent_final_answer' must be a string or null")
    if _squash(given) != _squash(final):
        raise StepProblem(
            f"the last step's answer {_short(final)} does not match 'agent_final_answer' "
            f"{_short(given)}"
        )
    return given


def _squash(text: str | None) -> str:
    return " ".join((text or "").split())


def _short(text: str | None) -> str:
    return "null" if text is None else repr(text if len(text) <= 60 else text[:57] + "…")


def _reference_length(result: dict[str, Any]) -> int | None:
    value = result.get("reference_length")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise StepProblem(f"'reference_length' must be a non-negative integer, got {value!r}")
    return value


# -- screenshots -----------------------------------------------------------------------------


@dataclass
class ShotSource:
    """Where one step's screenshot comes from: ``data`` (decoded from the JSON), ``path`` (a
    file inside the task folder), or neither with the ``problem``; ``url`` when the reference
    is a URL (kept, never fetched)."""

    name: str
    path: Path | None = None
    data: bytes | None = None
    problem: str | None = None
    url: str | None = None


def shot_source(base: Path, ref: str, i: int) -> ShotSource:
    """Resolve step ``i``'s screenshot reference ``ref`` in the task folder ``base`` (resolved):
    a file under ``trajectory/`` (or the folder), a data URI, a URL or bare base64."""
    if ref.lower().startswith("data:"):
        return _data_uri(ref, i)
    if _WEB.match(ref):
        shown = ref if len(ref) <= 80 else ref[:77] + "…"
        return ShotSource(shown, problem="a URL (not fetched)", url=ref)
    found = _file(base, ref)
    if found is not None:
        return found
    if len(ref) >= _MIN_BASE64 and _BASE64.match(ref):
        return _decoded(f"step {i} (base64)", ref)
    shown = ref if len(ref) <= 80 else ref[:77] + "…"
    return ShotSource(shown, problem="no such file under trajectory/ (nor a data URI or URL)")


def _file(base: Path, ref: str) -> ShotSource | None:
    """The file ``ref`` names under ``trajectory/`` (else under the task folder), never outside
    the folder; None when no such file exists there."""
    if "\0" in ref or len(ref) > 4096:
        return None
    for parent in (base / "trajectory", base):
        try:
            candidate = parent / ref
            real = candidate.resolve()
            exists = candidate.exists() or candidate.is_symlink()
        except (OSError, RuntimeError, ValueError):
            continue
        if not exists:
            continue
        name = Path(ref).name or ref
        if base not in real.parents:
            return ShotSource(name, problem="a path that leaves the task folder")
        if not real.is_file():
            return ShotSource(name, problem="not a regular file")
        if real.stat().st_size > images.MAX_BYTES:
            return ShotSource(name, problem=f"larger than {images.MAX_BYTES // 2**20} MiB")
        return ShotSource(name, path=real)
    return None


def _data_uri(ref: str, i: int) -> ShotSource:
    head, sep, payload = ref.partition(",")
    name = f"step {i} (data URI)"
    if not sep or not head.lower().endswith(";base64"):
        return ShotSource(name, problem="a data URI that is not base64")
    return _decoded(name, payload)


def _decoded(name: str, text: str) -> ShotSource:
    if len(text) > images.MAX_BYTES * 4 // 3 + 4:
        return ShotSource(name, problem=f"larger than {images.MAX_BYTES // 2**20} MiB")
    try:
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        return ShotSource(name, problem="not valid base64")
    return ShotSource(name, data=data)


# -- writing ---------------------------------------------------------------------------------


def final_action(answer: str | None) -> str:
    """The last step's action for ``answer`` (the form the upstream examples write)."""
    return f"TASK_COMPLETE -> ANSWER: {answer or ''}"


def result_json(
    *,
    task_id: str,
    task: str,
    reference_length: int | None,
    answer: str | None,
    steps: list[dict[str, Any]],
    webloop: dict[str, Any],
) -> str:
    """A v2 ``result.json``'s text (``steps``: the ``action_history`` objects, final included;
    ``webloop``: this project's own key, which readers of the schema ignore)."""
    result = {
        "schema_version": SCHEMA,
        "task_id": task_id,
        "task": task,
        "reference_length": reference_length,
        "agent_final_answer": answer,
        "action_history": steps,
        "webloop": webloop,
    }
    return json.dumps(result, indent=2, ensure_ascii=False)
