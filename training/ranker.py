"""The ranker's side of the trainer contract (:mod:`training.interface`).

A turn's prompt is parsed (:func:`rollouts.ranker.parse_prompt`), its candidates listed and their
texts embedded by the frozen MiniLM encoder; that work is cached per prompt hash, so every epoch
after the first runs only the scorer. The log-prob of a turn is the log-softmax of its reply's
action among the prompt's candidates (actions equal by parsed value, not by string); a reply
whose action is not a candidate is ``covered=False`` (log-prob 0, left out of losses).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from rollouts.encoder import TextEncoder, default_encoder
from rollouts.ranker import (
    Encoded,
    NotAWebloopPrompt,
    RankerModel,
    batch_tensors,
    candidates,
    encoded,
    encoder_texts,
    parse_prompt,
    prompt_key,
    segment_log_softmax,
    target_index,
)
from training.interface import DataMismatch, Turn, TurnLogprobs


class RankerTrainable:
    """A :class:`~rollouts.ranker.RankerModel` as a trainable policy (``kind = "ranker"``).

    ``max_cache``: prompts whose candidates and embeddings are kept (a dict, oldest dropped)."""

    kind = "ranker"

    def __init__(
        self, model: RankerModel, encoder: TextEncoder | None = None, max_cache: int = 200_000
    ) -> None:
        self.module = model
        self.encoder = encoder or default_encoder()
        self.max_cache = max_cache
        self._prepared: dict[str, Encoded] = {}
        self._targets: dict[tuple[str, str], int | None] = {}

    @classmethod
    def new(cls, seed: int = 0, **model_options: Any) -> RankerTrainable:
        """A fresh, seeded, untrained ranker."""
        torch.manual_seed(seed)
        return cls(RankerModel(seed=seed, **model_options))

    @classmethod
    def load(cls, path: str | Path) -> RankerTrainable:
        """A ranker checkpoint folder (written by :meth:`save`)."""
        return cls(RankerModel.from_pretrained(path))

    # -- the TrainablePolicy protocol ---------------------------------------------------------

    def parameters(self) -> Iterator[Any]:
        return (p for p in self.module.parameters() if p.requires_grad)

    def train(self, mode: bool = True) -> RankerTrainable:
        self.module.train(mode)
        return self

    def check_data(self, turns: Sequence[Turn]) -> None:
        """:class:`DataMismatch` for no turns, a prompt that is not a webloop prompt, or one
        without an accessibility tree (a screenshot-only prompt: the ranker cannot read it)."""
        if not turns:
            raise DataMismatch("no turns to train on (empty dataset or split)")
        for i, t in enumerate(turns):
            where = f"turn {t.key or i!r}" if isinstance(t, Turn) else f"item {i}"
            if not isinstance(t, Turn):
                raise DataMismatch(f"{where} is a {type(t).__name__}, not a training Turn")
            try:
                inp = parse_prompt(t.prompt)
            except NotAWebloopPrompt as exc:
                raise DataMismatch(f"{where}: not a webloop prompt ({exc})") from exc
            if not inp.tree.strip():
                raise DataMismatch(
                    f"{where}: the prompt has no accessibility tree (collect with prompt mode "
                    "a11y or both for the ranker)"
                )

    def counts(self, batch: Sequence[Turn]) -> tuple[list[float], list[bool]]:
        """``n_tokens`` (1 each) and ``covered`` of each turn, as :meth:`logprobs` gives them,
        without a forward pass."""
        self.prepare(batch)
        return [1.0] * len(batch), [self.target(t) is not None for t in batch]

    def candidate_logprobs(self, batch: Sequence[Turn]) -> list[torch.Tensor]:
        """Each turn's log-softmax over all of its prompt's candidates (differentiable): the
        whole action distribution at the state, for the exact KL to a reference policy."""
        if not batch:
            raise DataMismatch("candidate_logprobs of an empty batch")
        self.prepare(batch)
        enc = [self.prepared(t.prompt) for t in batch]
        ctx, elem, value, feats, seg = batch_tensors(enc)
        logp = segment_log_softmax(self.module(ctx, elem, value, feats, seg), seg, len(enc))
        return list(torch.split(logp, [len(e.candidates) for e in enc]))

    def logprobs(self, batch: Sequence[Turn]) -> TurnLogprobs:
        """Differentiable log-softmax of each turn's reply among its prompt's candidates."""
        if not batch:
            raise DataMismatch("logprobs of an empty batch")
        self.prepare(batch)  # the batch's new prompts in one encoder call, not one each
        enc = [self.prepared(t.prompt) for t in batch]
        targets = [self.target(t) for t in batch]
        ctx, elem, value, feats, seg = batch_tensors(enc)
        scores = self.module(ctx, elem, value, feats, seg)
        logp = segment_log_softmax(scores, seg, len(enc))
        offsets, pos = [], 0
        for e in enc:
            offsets.append(pos)
            pos += len(e.candidates)
        idx = torch.tensor(
            [off + (k if k is not None else 0) for off, k in zip(offsets, targets, strict=True)]
        )
        covered = torch.tensor([k is not None for k in targets])
        lp = torch.where(covered, logp[idx], torch.zeros((), dtype=logp.dtype))
        return TurnLogprobs(logprob=lp, n_tokens=torch.ones(len(batch)), covered=covered)

    def save(self, path: str | Path) -> None:
        """A checkpoint folder (``config.json`` + ``model.safetensors``) that :meth:`load` and
        the ``ranker`` rollout policy read."""
        self.module.save_pretrained(path)

    # -- caching ---------------------------------------------------------------------------------

    def prepared(self, prompt: str) -> Encoded:
        """Candidates and embeddings of a rendered prompt (cached by the prompt's sha256)."""
        key = prompt_key(prompt)
        if key not in self._prepared:
            self._prepare({key: prompt})
        return self._prepared[key]

    def prepare(self, turns: Sequence[Turn], batch: int = 64) -> None:
        """Fill the cache for ``turns``: the texts of ``batch`` distinct prompts go to the
        encoder in one call (3x the texts/s of prompt by prompt: fewer, fuller passes).

        The vectors are :meth:`TextEncoder.encode_exact`'s: read from the process's encoder
        cache (the texts the policy's rollouts and earlier trainings encoded) only where a
        vector's bits do not depend on what it was computed beside, else computed here: the
        same rows and seed train the same checkpoint whatever the process encoded before."""
        todo = {prompt_key(t.prompt): t.prompt for t in turns}
        items = [(k, p) for k, p in todo.items() if k not in self._prepared]
        for i in range(0, len(items), batch):
            self._prepare(dict(items[i : i + batch]))

    def _prepare(self, prompts: dict[str, str]) -> None:
        try:
            listed = [(k, candidates(inp), inp) for k, inp in _parsed(prompts)]
        except NotAWebloopPrompt as exc:
            raise DataMismatch(f"not a webloop prompt ({exc})") from exc
        texts = [encoder_texts(inp, cands) for _, cands, inp in listed]
        vectors = self.encoder.encode_exact([t for group in texts for t in group])
        start = 0
        for (k, cands, _), group in zip(listed, texts, strict=True):
            if len(self._prepared) >= self.max_cache:
                self._prepared.pop(next(iter(self._prepared)))
            self._prepared[k] = encoded(cands, vectors[start : start + len(group)])
            start += len(group)

    def target(self, turn: Turn) -> int | None:
        """The index of the turn's reply among its prompt's candidates (None: not a candidate)."""
        key = (prompt_key(turn.prompt), turn.completion)
        if key not in self._targets:
            self._targets[key] = target_index(
                self.prepared(turn.prompt).candidates, turn.completion
            )
        return self._targets[key]

    def greedy_and_target(self, turn: Turn) -> tuple[int, int | None]:
        """(index of the top-scored candidate, index of the reply's candidate or None)."""
        enc = self.prepared(turn.prompt)
        with torch.no_grad():
            scores = self.module(*batch_tensors([enc]))
        return int(scores.argmax()), self.target(turn)


def _parsed(prompts: dict[str, str]) -> Iterator[tuple[str, Any]]:
    """``(key, parsed prompt)`` of each prompt."""
    for key, prompt in prompts.items():
        yield key, parse_prompt(prompt)
