"""The one contract between the trainer and the two model paths (VLM and ranker).

A training example is one turn: the prompt a policy saw (``render(messages)`` of the shared prompt
builder, images as ``sha256:`` references, the screenshots beside it as PNG bytes, in order) and
the reply it should give (SFT) or gave (RL). Both model paths turn a batch of such turns into the
log-probability of the reply under the model, differentiable; the trainer (:mod:`training.trainer`)
builds every loss — SFT, PPO-clip, KL — from those numbers alone, so SFT and RL are one code path
for both models.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


class DataMismatch(ValueError):
    """A dataset does not fit the model (no screenshots for a VLM, another prompt format, an empty
    split …): raised before training starts, with what is wrong and where."""


@dataclass(frozen=True)
class Turn:
    """One training turn.

    ``prompt``: ``rollouts.prompts.render(messages)`` — canonical JSON, images as ``sha256:<hex>``.
    ``images``: the PNG bytes of those images, in prompt order (empty for text-only prompts).
    ``completion``: the assistant reply (``"Thought: …\\nAction: …"`` or ``"Action: …"``).
    ``weight``: example weight (SFT; curation's ``weight``). ``advantage``: the turn's RL
    advantage.
    ``old_logprob``: the log-prob of ``completion`` under the policy that sampled it (RL; None:
    recomputed before the first update). ``key``: a stable id (``traj_id/step_idx``).
    ``reply_ids``: the token ids the rollout engine sampled for ``completion`` (None: the trainer
    tokenises the text); the VLM path trains on exactly these. ``image_spans``: where the
    engine's prompt ids held the image tokens (``(start, length)`` runs; None: unknown), checked
    against the trainer's own prompt ids."""

    prompt: str
    completion: str
    images: tuple[bytes, ...] = ()
    weight: float = 1.0
    advantage: float = 0.0
    old_logprob: float | None = None
    key: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    reply_ids: tuple[int, ...] | None = None
    image_spans: tuple[tuple[int, int], ...] | None = None


@dataclass(frozen=True)
class TurnLogprobs:
    """Per-turn results of :meth:`TrainablePolicy.logprobs` (tensors of shape ``[B]``).

    ``logprob``: the (reasoning-weighted) sum of the reply's token log-probs — for the VLM,
    ``λ·Σ thought tokens + Σ action tokens`` (RL4VLM); for the ranker, the log-softmax of the
    reply's candidate. ``n_tokens``: the (weighted) token count the sum ran over (1 for the ranker),
    so SFT can normalise per token. ``covered``: False where the reply cannot be produced by the
    model at all (the ranker: the target action is not among the candidates) — such turns are left
    out of losses and counted."""

    logprob: Any
    n_tokens: Any
    covered: Any


class TrainablePolicy(Protocol):
    """What the trainer needs from a model path."""

    kind: str  # "vlm" | "ranker"
    module: Any  # the torch.nn.Module being trained (its state_dict is what a resume restores)

    def parameters(self) -> Iterator[Any]:
        """The trainable torch parameters."""

    def logprobs(self, batch: Sequence[Turn]) -> TurnLogprobs:
        """Differentiable log-probs of each turn's completion given its prompt (train mode)."""

    def check_data(self, turns: Sequence[Turn]) -> None:
        """Raise :class:`DataMismatch` when the data cannot train this model (before training)."""

    def save(self, path: Path) -> None:
        """Write a checkpoint folder loadable by the path's ``load`` and by its rollout policy
        (``hf`` / ``ranker``) like a Hugging Face model folder."""

    def train(self, mode: bool = True) -> Any: ...
