"""The ranker as a registered rollout policy (``ranker``): rank the candidates, take or sample one.

The top candidate at temperature 0, else a sample of softmax(scores / T); the reply is the
candidate's grammar text, with its log-probability under softmax(scores). Concurrent episodes'
prompts are ranked together (one encoder call for their new texts).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rollouts.actions import parse_action
from rollouts.batching import BatchWorker
from rollouts.encoder import TextEncoder, default_encoder
from rollouts.policies import PolicyContext, PolicyOutput, register
from rollouts.prompts import PromptConfig, build_messages
from rollouts.ranker.candidate import Candidate, candidates
from rollouts.ranker.encoding import encode_input, encoder_texts
from rollouts.ranker.model import batch_tensors, ranker_model_class
from rollouts.ranker.prompt import parse_prompt


@register("ranker")
class RankerPolicy:
    """The candidate ranker as a rollout policy.

    ``model_path``: a folder written by :meth:`RankerModel.save_pretrained` (None: a random,
    ``seed``-initialised model — a valid, untrained policy). ``temperature`` 0: the top-scored
    candidate; above 0: a sample of softmax(scores / T) drawn with the episode's ``ctx.rng``.
    ``logprob``: the chosen candidate's log-probability under softmax(scores) (T = 1).
    ``prompt``: the prompt config; its mode must include the accessibility tree."""

    name = "ranker"

    def __init__(
        self,
        model_path: str | Path | None = None,
        temperature: float = 0.0,
        prompt: PromptConfig | None = None,
        seed: int = 0,
        model: Any = None,
        encoder: TextEncoder | None = None,
    ) -> None:
        self.prompt = prompt or PromptConfig(mode="a11y")
        if self.prompt.mode not in ("a11y", "both"):
            raise ValueError(
                f"the ranker reads the accessibility tree: prompt mode "
                f"{self.prompt.mode!r} has none (use a11y or both)"
            )
        if temperature < 0:
            raise ValueError("temperature must be >= 0")
        if model is None:
            cls = ranker_model_class()
            model = cls.from_pretrained(model_path) if model_path else cls(seed=seed)
        self.model = model.eval()
        self.temperature = float(temperature)
        self.encoder = encoder or default_encoder()
        # concurrent episodes' prompts are ranked together (one encoder call for their new texts)
        self._worker = BatchWorker(self.rank_many, max_batch=64, name="ranker")

    def rank(self, messages: list[dict[str, Any]]) -> tuple[list[Candidate], np.ndarray]:
        """Candidates of the prompt and their scores (no sampling)."""
        return self.rank_many([messages])[0]

    def rank_many(
        self, prompts: Sequence[list[dict[str, Any]]]
    ) -> list[tuple[list[Candidate], np.ndarray]]:
        """:meth:`rank` of several prompts: their new texts in one encoder call (the expensive
        part), then each prompt through the scorer on its own. A prompt's scores are the same
        bits whatever it was ranked with (the encodings are a function of the text alone), so
        batching never changes what a run does."""
        import torch

        inputs = [parse_prompt(m) for m in prompts]
        listed = [candidates(inp) for inp in inputs]
        self.encoder.encode(
            [t for inp, c in zip(inputs, listed, strict=True) for t in encoder_texts(inp, c)]
        )
        out = []
        for inp, cands in zip(inputs, listed, strict=True):
            enc = encode_input(inp, self.encoder, cands)
            with torch.no_grad():
                scores = self.model(*batch_tensors([enc]))
            out.append((enc.candidates, scores.numpy().astype(np.float64)))
        return out

    async def act(self, ctx: PolicyContext) -> PolicyOutput:
        messages = build_messages(
            ctx.instruction, ctx.turns, self.prompt, ctx.memory.get("summary")
        )
        start = time.perf_counter()
        cands, scores = await self._worker.submit(messages)
        logp = _log_softmax(scores)
        if self.temperature == 0.0:
            i = int(np.argmax(scores))
        else:
            z = scores / self.temperature
            p = np.exp(z - z.max())
            p /= p.sum()
            i = int(np.searchsorted(np.cumsum(p), ctx.rng.random() * p.sum(), side="right"))
            i = min(i, len(cands) - 1)
        text = f"Action: {cands[i].text}"
        return PolicyOutput(
            text, parse_action(text), float(logp[i]), time.perf_counter() - start, messages
        )

    async def aclose(self) -> None:
        """Stop the ranking thread (a later call starts it again)."""
        self._worker.close()

    async def top_k(self, ctx: PolicyContext, k: int) -> list[PolicyOutput]:
        """The ``k`` most likely distinct actions at the context's state, best first (the
        process reward model's candidates: the policy's choice and its runners-up, where
        samples of a confident policy would all be the same action)."""
        messages = build_messages(
            ctx.instruction, ctx.turns, self.prompt, ctx.memory.get("summary")
        )
        start = time.perf_counter()
        cands, scores = await self._worker.submit(messages)
        logp, took = _log_softmax(scores), time.perf_counter() - start
        out = []
        for i in np.argsort(-scores, kind="stable")[:k]:
            text = f"Action: {cands[i].text}"
            out.append(PolicyOutput(text, parse_action(text), float(logp[i]), took, messages))
        return out


def _log_softmax(scores: np.ndarray) -> np.ndarray:
    logp = scores - scores.max()
    return logp - np.log(np.exp(logp).sum())
