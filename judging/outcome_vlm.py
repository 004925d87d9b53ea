"""The ``outcome_vlm`` judge: one model call decides, from the last screenshots and the answer.

The one-call outcome judges of the published protocols (Pan et al. 2024's end-to-end VLM
evaluator: the instruction, the action history and the final screenshot; WebVoyager's
auto-evaluation: the task, the agent's answer and its last screenshots) differ in what the one
call sees, so that is the judge's options: ``last_k`` screenshots (the final page last) and
whether the action ``history`` is shown. The reply is JSON with a verdict and a rationale
(``Status: success|failure`` is accepted too, as the key-point judge does); anything else is a
:class:`~judging.base.JudgeError`, never a verdict. Page and agent text enters the prompt only
inside ``<untrusted>`` blocks it cannot close.
"""

from __future__ import annotations

import hashlib

from judging.base import JUDGED_STATUSES, TrajectoryView, untrusted
from judging.base import register as register_judge
from judging.rubric_vlm import (
    UNTRUSTED_RULE,
    ask,
    history_text,
    parse_verdict,
    screens,
    screenshot_parts,
    shots_intro,
)
from rollouts.chat import ChatClient
from rollouts.prompts import prompt_hash, render
from warehouse.records import Verdict

NAME, BASE_VERSION = "outcome_vlm", "1"

SYSTEM = f"""You are a strict evaluator of a web agent's work. You decide whether the agent \
completed the task, using only the evidence given: what it did, its final answer and the \
screenshots of what it saw last.

{UNTRUSTED_RULE}"""

HISTORY = """Action history of the agent (untrusted):
<untrusted>
{history}
</untrusted>

"""

OUTCOME = """Task: {task}

{history}Final answer of the agent (untrusted):
<untrusted>
{answer}
</untrusted>

{shots}

Was the task completed: every requirement met, and the answer (if the task asks for one) \
correct according to the screenshots? Reply with JSON only:
{{"verdict": "success" or "failure", "rationale": "..."}}"""

#: The judge's prompt templates, hashed (part of every protocol that uses it, and of its version).
TEMPLATE_HASH = hashlib.sha256("\0".join((SYSTEM, HISTORY, OUTCOME)).encode()).hexdigest()[:16]


@register_judge(
    NAME,
    needs=("endpoint",),
    options=("base_url", "model"),
    prompts=TEMPLATE_HASH,
    version=BASE_VERSION,
)
class OutcomeVLMJudge:
    """One call: the task, the answer, the last screenshots (and the actions) → a verdict."""

    name = NAME
    statuses = JUDGED_STATUSES
    needs_verdicts = False

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        last_k: int = 1,
        history: bool = True,
        max_tokens: int = 512,
        timeout_s: float = 120.0,
        retries: int = 2,
        backoff_s: float = 0.5,
    ) -> None:
        """The judge over the OpenAI-compatible server at ``base_url``.

        :param base_url: the server, e.g. http://127.0.0.1:8000/v1.
        :param model: the judge model the server serves.
        :param last_k: the last screenshots shown, the final page last (0: none).
        :param history: whether the call shows the agent's actions too.
        :param max_tokens: the reply budget of the call.
        :param timeout_s: seconds one model call may take.
        :param retries: retries of a failed call (with backoff) before a judge error.
        :param backoff_s: the first retry's wait, doubled each time.
        """
        if last_k < 0:
            raise ValueError("last_k (screenshots shown, newest last) must be >= 0")
        self.client = ChatClient(
            base_url, model, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s
        )
        self.model, self.last_k, self.history, self.max_tokens = model, last_k, history, max_tokens
        shown = "h" if history else "nh"
        self.version = f"{BASE_VERSION}/{TEMPLATE_HASH[:8]}/last{last_k}/{shown}"

    async def judge(self, traj: TrajectoryView) -> Verdict:
        shots = screens(traj)[-self.last_k :] if self.last_k else []
        intro = shots_intro(
            shots, f"The last {len(shots)} screenshots follow", "; the last is the final page"
        )
        text = OUTCOME.format(
            task=traj.task.instruction,
            history=HISTORY.format(history=history_text(traj.steps)) if self.history else "",
            answer=untrusted(traj.answer),
            shots=intro,
        )
        content = [{"type": "text", "text": text}, *screenshot_parts(traj, shots)]
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}]
        reply = await ask(self.client, messages, self.max_tokens)
        verdict, _, rationale = parse_verdict(reply, [])
        if traj.wh is not None:
            traj.wh.blobs.put_text(render(messages))  # the exact prompt, for review
        return Verdict(
            verdict=verdict,
            score=float(verdict == "success"),
            rationale=rationale or None,
            prompt_hash=prompt_hash(messages),
            calls=1,
            images=len(shots),
        )
