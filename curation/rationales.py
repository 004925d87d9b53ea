"""Rationales (ERA): a teacher's thought for each step of successful expert trajectories, stored
apart from the trajectory (``rationales``: traj_id, step_idx, teacher) and added to training
data only when a recipe asks for that teacher (``include.rationales``).

Teachers:

* ``expert``: a deterministic template from what the expert knows: the instruction, the plan
  step the action carries out (the expert's output names it: ``step N of the plan``) and the
  element it targets (its line in the step's accessibility snapshot, else the plan's selector).
* ``openai``: any OpenAI-compatible model sees the step exactly as the policy saw it (the
  shared prompt builder over the stored observations: earlier actions as text, the last k
  screenshots, the current accessibility tree), plus the action taken, and explains why that
  action is right, as ``Thought: …``. A reply without a usable thought is a per-step error:
  counted and reported, never stored, and the run goes on (a re-run tries it again).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rollouts.actions import Answer, Click, ParseError, Select, Type, format_action, parse_action
from rollouts.chat import ChatClient, ModelUnavailable
from rollouts.prompts import PromptConfig, Turn, action_ref, build_messages, prompt_hash
from warehouse.records import Rationale, Step, Task, from_frame
from warehouse.relations import with_relations
from warehouse.store import Warehouse


class RationaleError(ValueError):
    """No usable rationale for one step (the run goes on)."""


def _setting(default: Any, help: str, **bounds: float) -> Any:
    """A config field with its help text and bounds in the metadata the stage configs use
    (:func:`stages.config.setting`'s, which a library below ``stages`` cannot import): the
    ``webloop rationales`` options and the YAML loader come from it."""
    return field(default=default, metadata={"help": help, **bounds})


@dataclass(frozen=True)
class RationalesConfig:
    """Which steps, which teacher (stored with the run)."""

    teacher: Literal["expert", "openai"] = _setting(
        "expert", "expert (template) or openai (any compatible model)."
    )
    run: str | None = _setting(None, "Only trajectories of this run.")
    base_url: str | None = _setting(None, "openai teacher: endpoint URL.")
    model: str | None = _setting(None, "openai teacher: model name.")
    max_steps: int | None = _setting(None, "At most this many steps now.", min=1)
    k_images: int = _setting(3, "openai: screenshots of the last k steps.", min=0, max=32)
    concurrency: int = _setting(4, "Model requests at once.", min=1, max=256)

    @property
    def teacher_name(self) -> str:
        return "expert" if self.teacher == "expert" else f"openai:{self.model}"


# -- the expert's template ----------------------------------------------------------------------

PLAN_STEP = re.compile(r"step (\d+) of the plan( is out of view)?", re.I)
_REF_LINE = r"^\s*-\s*(.*?)\s*\[ref={ref}\].*$"


def describe_element(ref: str | None, a11y: str | None, planned: Any) -> str:
    """The targeted element in words: its accessibility line (``button "Add to cart"``), else
    the plan's CSS selector."""
    if ref and a11y:
        m = re.search(_REF_LINE.format(ref=re.escape(ref)), a11y, re.M)
        if m and m.group(1).strip():
            return "the " + re.sub(r"\s*\[[^\]]*\]", "", m.group(1)).rstrip(":").strip()
    target = getattr(planned, "target", None)
    if target is not None and target.selector:
        return f"the element {target.selector}"
    return "the target element"


def _phrase(planned: Any, element: str) -> str:
    match planned:
        case Click():
            return f"click {element}"
        case Type(text=text):
            return f'type "{text}" into {element}'
        case Select(value=value):
            return f'choose "{value}" in {element}'
        case Answer(text=text):
            return f'answer "{text}", which the page shows'
    return format_action(planned)


def expert_thought(instruction: str, reference: Sequence[str], step: Step, a11y: str | None) -> str:
    """The expert teacher's rationale for one step of an expert trajectory."""
    m = PLAN_STEP.search(step.model_output or "")
    if not m:
        raise RationaleError("the step's output names no step of the plan")
    n = int(m.group(1))
    if not 1 <= n <= len(reference):
        raise RationaleError(f"plan step {n} is not in the {len(reference)}-step reference")
    planned = parse_action(reference[n - 1])
    if isinstance(planned, ParseError):
        raise RationaleError(f"reference step {n} does not parse: {planned.reason}")
    ref = ((step.action or {}).get("target") or {}).get("ref")
    element = describe_element(ref, a11y, planned)
    head = f"The task: {instruction} Step {n} of the {len(reference)}-step plan"
    if m.group(2):
        return f"{head} needs {element}, which is out of view, so I scroll to it first."
    return f"{head} is to {_phrase(planned, element)}. On this page that is {step.action_text}."


# -- the model's rationale ----------------------------------------------------------------------

RATIONALE_NOTE = """The action taken at this step was:
<untrusted>
{action}
</untrusted>
It was right: this step belongs to a successful attempt. Explain briefly why this action is the \
right one at this point of the task. Reply as:
Thought: <your reasoning>"""

_THOUGHT = re.compile(r"thought\s*:\s*(.*?)(?:\n\s*action\s*:|\Z)", re.I | re.S)


def parse_thought(reply: str, max_chars: int = 2000) -> str:
    """The ``Thought:`` of a reply; :class:`RationaleError` for none, an empty or overlong one, or
    one that is not text."""
    m = _THOUGHT.search(reply or "")
    if not m:
        raise RationaleError(f"no 'Thought:' in the reply: {(reply or '')[:120]!r}")
    thought = m.group(1).strip()
    if len(thought.split()) < 3:
        raise RationaleError(f"the thought is too short: {thought[:120]!r}")
    if len(thought) > max_chars:
        raise RationaleError(f"the thought is longer than {max_chars} characters")
    letters = sum(c.isalpha() for c in thought)
    if letters < 0.5 * len(thought.replace(" ", "")):
        raise RationaleError(f"the thought is not text: {thought[:120]!r}")
    return thought


def step_turns(steps: Sequence[Step], i: int, blobs: Any, k_images: int = 3) -> list[Turn]:
    """The prompt's view of step ``i`` (as the policy saw it): earlier actions as text, the last
    k screenshots, the current accessibility tree."""
    shown = steps[: i + 1]
    out = []
    for j, s in enumerate(shown):
        recent, current = j >= len(shown) - max(k_images, 1), j == len(shown) - 1
        shot = blobs.get(s.screenshot_hash) if recent and s.screenshot_hash else None
        named = current or action_ref(s.action_text) is not None  # its line names the element
        tree = blobs.get_text(s.a11y_hash) if named and s.a11y_hash else None
        out.append(
            Turn(
                s.url or "",
                s.title or "",
                shot,
                tree,
                None if current else (s.action_text or "(invalid action)"),
                None if current else s.action_error,
            )
        )
    return out


def rationale_messages(
    instruction: str, turns: list[Turn], action_text: str, prompt: PromptConfig
) -> list[dict[str, Any]]:
    messages = build_messages(instruction, turns, prompt)
    note = RATIONALE_NOTE.format(action=action_text.replace("</untrusted", "‹/untrusted"))
    user = messages[1]
    return [messages[0], {**user, "content": [*user["content"], {"type": "text", "text": note}]}]


# -- running ------------------------------------------------------------------------------------


@dataclass
class Work:
    """One trajectory's steps that need a rationale."""

    traj_id: str
    task: Task
    steps: list[Step]  # all its steps, in order
    todo: list[int]  # step indices to write


@dataclass
class RationaleSummary:
    selected: int = 0
    written: int = 0
    errors: int = 0
    error_examples: list[str] = field(default_factory=list)


def select_work(wh: Warehouse, cfg: RationalesConfig) -> list[Work]:
    """Steps of successful expert trajectories without a rationale from the teacher, with the
    task version each trajectory ran (``trajectory_tasks`` of :mod:`warehouse.relations`; a
    trajectory whose version is not stored is left out)."""
    pending = wh.sql(
        "SELECT s.traj_id, s.step_idx FROM steps s JOIN trajectories t USING (traj_id) "
        "WHERE t.status = 'success' AND t.policy = 'expert' AND ($run IS NULL OR t.run_id = $run) "
        "AND s.action_text IS NOT NULL AND NOT EXISTS (SELECT 1 FROM rationales r "
        "WHERE r.traj_id = s.traj_id AND r.step_idx = s.step_idx AND r.teacher = $teacher) "
        "ORDER BY s.traj_id, s.step_idx",
        {"run": cfg.run, "teacher": cfg.teacher_name},
    ).rows()
    if cfg.max_steps:
        pending = pending[: cfg.max_steps]
    ids = sorted({t for t, _ in pending})
    if not ids:
        return []
    ran = wh.sql(
        with_relations("SELECT * FROM trajectory_tasks WHERE list_contains($ids, traj_id)"),
        {"ids": ids},
    )
    tasks = dict(zip(ran["traj_id"], from_frame(Task, ran), strict=True))
    steps: dict[str, list[Step]] = {}
    for s in from_frame(
        Step,
        wh.sql(
            "SELECT * FROM steps WHERE list_contains($ids, traj_id) ORDER BY traj_id, step_idx",
            {"ids": ids},
        ),
    ):
        steps.setdefault(s.traj_id, []).append(s)
    todo: dict[str, list[int]] = {}
    for t, i in pending:
        todo.setdefault(t, []).append(i)
    out = [Work(tid, task, steps.get(tid, []), todo[tid]) for tid, task in tasks.items()]
    return sorted(out, key=lambda w: w.traj_id)


class ExpertRationales:
    """The deterministic template teacher."""

    name = "expert"
    model = None

    def __init__(self, wh: Warehouse) -> None:
        self.wh = wh

    async def thought(self, work: Work, i: int) -> tuple[str, str | None]:
        step = work.steps[i]
        a11y = self.wh.blobs.get_text(step.a11y_hash) if step.a11y_hash else None
        return expert_thought(
            work.task.instruction, list(work.task.reference or []), step, a11y
        ), None


class OpenAIRationales:
    """A model's thought for the step, from the policy's own view of it."""

    def __init__(self, wh: Warehouse, base_url: str, model: str, k_images: int = 3) -> None:
        self.wh, self.model = wh, model
        self.name = f"openai:{model}"
        self.client = ChatClient(base_url, model, timeout_s=120.0, retries=2)
        self.prompt = PromptConfig(k_images=k_images)

    async def thought(self, work: Work, i: int) -> tuple[str, str | None]:
        turns = step_turns(work.steps, i, self.wh.blobs, self.prompt.k_images)
        action = work.steps[i].action_text or ""
        messages = rationale_messages(work.task.instruction, turns, action, self.prompt)
        try:
            reply = await self.client.text(messages, temperature=0.0, max_tokens=300)
        except ModelUnavailable as exc:
            raise RationaleError(f"teacher model unavailable: {exc}"[:300]) from exc
        return parse_thought(reply), prompt_hash(messages)

    async def aclose(self) -> None:
        await self.client.aclose()


def make_rationale_teacher(wh: Warehouse, cfg: RationalesConfig) -> Any:
    if cfg.teacher == "expert":
        return ExpertRationales(wh)
    if cfg.teacher == "openai":
        if not cfg.base_url or not cfg.model:
            raise ValueError("--teacher openai needs --base-url and --model")
        return OpenAIRationales(wh, cfg.base_url, cfg.model, cfg.k_images)
    raise ValueError(f"--teacher: unknown teacher {cfg.teacher!r}; known: expert, openai")


async def run_rationales_async(
    wh: Warehouse,
    cfg: RationalesConfig,
    run_id: str | None = None,
    progress: Callable[[RationaleSummary], None] | None = None,
    *,
    chunk: int = 64,
) -> dict[str, Any]:
    """Write the missing rationales of ``cfg.teacher``; per-step errors are counted, not fatal."""
    teacher = make_rationale_teacher(wh, cfg)
    summary = RationaleSummary()
    sem = asyncio.Semaphore(max(1, cfg.concurrency))

    async def one(work: Work, i: int) -> Rationale | None:
        async with sem:
            try:
                thought, phash = await teacher.thought(work, i)
            except RationaleError as exc:
                summary.errors += 1
                if len(summary.error_examples) < 5:
                    summary.error_examples.append(f"{work.traj_id}#{i}: {exc}"[:300])
                return None
        return Rationale(work.traj_id, i, teacher.name, thought, teacher.model, phash, run_id)

    try:
        jobs = [(w, i) for w in select_work(wh, cfg) for i in w.todo]
        summary.selected = len(jobs)
        for start in range(0, len(jobs), chunk):
            rows = await asyncio.gather(*(one(w, i) for w, i in jobs[start : start + chunk]))
            kept = [r for r in rows if r is not None]
            if kept:
                wh.write(kept)
            summary.written += len(kept)
            if progress:
                progress(summary)
    finally:
        if hasattr(teacher, "aclose"):
            await teacher.aclose()
    return {
        "run_id": run_id,
        "teacher": teacher.name,
        "selected": summary.selected,
        "written": summary.written,
        "errors": summary.errors,
        "error_examples": summary.error_examples,
    }
