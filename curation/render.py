"""A stored trajectory's prompts and targets, rendered by the rollout prompt builder.

The prompt at a step is ``rollouts.prompts.build_messages`` over the trajectory's stored steps,
exactly as the rollout engine built it: every earlier step is a ``Turn`` with its action text
(:data:`INVALID` where the output did not parse) and its error, the current step's observation
carries the accessibility tree; screenshots and trees come from the blob store. The prompt config
is the run's (``runs.config``: ``prompt_mode``, ``self_summary``; the running summary is the last
``Summary:`` line of the earlier outputs) with the recipe's ``output.k_images``. With the run's
own ``k_images`` the rendered prompt is byte-identical to the stored ``steps.prompt_hash`` blob
(``render(messages)``).

A row stores the prompt as ``render(messages)`` (images as ``sha256:<hex>`` references) plus the
screenshots, in order, as PNG bytes (``images``); :func:`sft_messages` turns a row back into
OpenAI chat messages with data URLs and the assistant reply.

The target is the model's reply as a model writes it (:meth:`StoredTrajectory.target`):
* a teacher rationale for the step: ``"Thought: …\\nAction: …"``;
* the expert (``policy`` starting with ``expert``): ``"Action: <recorded action text>"`` (its
  own "thought" is plan bookkeeping, not reasoning);
* any other policy: the stored ``model_output`` verbatim.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from curation.blob_reader import BlobReader
from rollouts.prompts import (
    BLOB_REF,
    DATA_URL,
    PromptConfig,
    Turn,
    action_ref,
    build_messages,
    render,
)

INVALID = "(invalid action)"  # what the engine shows for a step whose output did not parse


def expert_policy(policy: str | None) -> bool:
    """Whether ``policy`` names the scripted expert (``expert``, ``expert:…``)."""
    return bool(policy) and str(policy).startswith("expert")


def reply(action_text: str, thought: str | None = None) -> str:
    """A target formatted as a model reply: ``Thought: …\\nAction: …`` (no thought: the action
    line alone)."""
    return f"Thought: {thought}\nAction: {action_text}" if thought else f"Action: {action_text}"


def prompt_config(run_config: dict[str, Any] | None, k_images: int) -> PromptConfig:
    """The prompt config a run's policy used (``CollectConfig`` fields), with ``k_images``."""
    c = run_config or {}
    mode = c.get("prompt_mode") or "both"
    return PromptConfig(
        mode=mode,
        k_images=k_images,
        self_summary=bool(c.get("self_summary")),
        max_a11y_chars=int(c.get("a11y_chars") or 12_000),
        a11y_focus=bool(c.get("a11y_focus")),
        system=c.get("system_prompt") or "full",
    )


_SUMMARY = re.compile(r"^\s*summary\s*:\s*(.+)$", re.I | re.M)  # rollouts.policies


def summaries(outputs: Sequence[str | None]) -> list[str | None]:
    """The running self-summary each step's prompt showed: the last ``Summary:`` line of the
    earlier outputs (as ``rollouts.policies.remember_summary`` keeps it)."""
    out, current = [], None
    for text in outputs:
        out.append(current)
        m = _SUMMARY.search(text or "")
        if m:
            current = m.group(1).strip()[:1000]
    return out


def sft_messages(row: dict[str, Any]) -> list[dict[str, Any]]:
    """An exported SFT row → OpenAI chat messages (images as PNG data URLs) + the assistant
    reply. ``render(sft_messages(row)[:-1])`` is the prompt the policy saw, byte for byte, when
    the images are read as stored (``datasets.Image(decode=False)``, or Arrow/Parquet): decoded
    PIL images are re-encoded here, same pixels but other PNG bytes, so other image hashes."""
    messages = json.loads(row["prompt"])
    shots = iter(_image_bytes(img) for img in row["images"])
    for m in messages:
        if isinstance(m.get("content"), list):
            for part in m["content"]:
                url = (part.get("image_url") or {}).get("url", "")
                if url.startswith(BLOB_REF):
                    part["image_url"]["url"] = DATA_URL + base64.b64encode(next(shots)).decode()
    return [*messages, {"role": "assistant", "content": row["completion"]}]


def chat_messages(prompt: str, completion: str) -> list[dict[str, Any]]:
    """The prompt (``render(messages)``) and its target as chat messages in the layout Hugging
    Face processors' chat templates and TRL's trainers read: every content a list of parts,
    ``{"type": "text", "text": …}`` or ``{"type": "image", "text": None}`` (the image itself
    is the row's ``images`` entry at the same position), then the assistant's reply."""
    out = []
    for m in json.loads(prompt):
        content = m.get("content")
        parts = (
            [_part(p) for p in content]
            if isinstance(content, list)
            else [{"type": "text", "text": str(content or "")}]
        )
        out.append({"role": m["role"], "content": parts})
    out.append({"role": "assistant", "content": [{"type": "text", "text": completion}]})
    return out


def _part(part: dict[str, Any]) -> dict[str, Any]:
    if part.get("type") == "image_url" or "image_url" in part:
        return {"type": "image", "text": None}
    return {"type": "text", "text": str(part.get("text") or "")}


def _image_bytes(img: Any) -> bytes:
    if isinstance(img, dict):
        return img["bytes"]
    if isinstance(img, bytes | bytearray):
        return bytes(img)
    import io  # a decoded PIL image (datasets' default): its original bytes are gone

    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


@dataclass
class StoredTrajectory:
    """One trajectory's rows, ready to render prompts at any of its steps."""

    info: dict[str, Any]
    steps: list[dict[str, Any]]
    config: PromptConfig
    reader: BlobReader
    summaries: list[str | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.config.self_summary:
            self.summaries = summaries([s["model_output"] for s in self.steps])

    def turns(self, i: int) -> list[Turn]:
        """The prompt's turns at step ``i``: earlier steps with their actions, then step i."""
        k = self.config.k_images if self.config.mode in ("screenshot", "both") else 0
        out = []
        for j, s in enumerate(self.steps[: i + 1]):
            shot = self.reader.get(s["screenshot_hash"], "screenshot") if j > i - k else None
            if j < i:
                text = s["action_text"] if s["action_text"] is not None else INVALID
                err = s["action_error"]
                tree = self._tree(s) if action_ref(text) else None  # names its element
                out.append(Turn(s["url"] or "", s["title"] or "", shot, tree, text, err))
            else:
                a11y = self._tree(s) if self.config.mode in ("a11y", "both") else None
                out.append(Turn(s["url"] or "", s["title"] or "", shot, a11y))
        return out

    def _tree(self, step: dict[str, Any]) -> str | None:
        raw = self.reader.get(step["a11y_hash"], "a11y")
        return raw.decode("utf-8") if raw is not None else None

    def prompt(self, i: int) -> tuple[str, list[dict[str, Any]], list[str]]:
        """(render(messages), images as Image() values, their hashes) at step ``i``."""
        turns = self.turns(i)
        summary = self.summaries[i] if self.config.self_summary else None
        messages = build_messages(self.info["instruction"], turns, self.config, summary)
        k = self.config.k_images if self.config.mode in ("screenshot", "both") else 0
        shown = [(t.screenshot, s) for t, s in zip(turns, self.steps[: i + 1], strict=True)]
        shown = [(b, s["screenshot_hash"]) for b, s in shown[-k:] if b] if k else []
        return (
            render(messages),
            [{"bytes": b, "path": None} for b, _ in shown],
            [h for _, h in shown],
        )

    def target(self, i: int, rationale: str | None = None) -> str:
        s = self.steps[i]
        if s["action_text"] is not None and (rationale or expert_policy(self.info["policy"])):
            return reply(s["action_text"], rationale)
        return s["model_output"] or ""


def base_columns(t: StoredTrajectory) -> dict[str, Any]:
    """The columns every row kind copies from its trajectory's task and run."""
    i = t.info
    return {k: i.get(k) for k in ("task_id", "suite", "site", "split", "policy", "run_id")}
