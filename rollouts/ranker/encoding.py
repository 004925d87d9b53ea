"""A prompt made ready for the scorer: its context and candidate texts through the encoder.

Each candidate has two texts for the frozen MiniLM encoder (:mod:`rollouts.encoder`): the
element (role, name, surrounding text) and the value (typed text, option, answer), embedded
separately so that both repeat across steps and hit the text-hash cache; the context is three
texts (instruction, page, last action). :func:`encode_input` lists a prompt's candidates and
embeds everything in one encoder call; :class:`Encoded` holds the arrays.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rollouts.encoder import TextEncoder, default_encoder
from rollouts.ranker.candidate import Candidate, candidates
from rollouts.ranker.features import N_FEATURES
from rollouts.ranker.prompt import RankerInput

LAST_ACTIONS = 3
"""How many of the latest actions the third context text describes."""


def context_texts(inp: RankerInput) -> tuple[str, str, str]:
    """The three context texts: instruction, page (title and URL path), the last
    :data:`LAST_ACTIONS` actions (newest first, refs replaced by the element each acted on)."""
    path = re.sub(r"^\w+://[^/]+", "", inp.url)
    page = f"{inp.title} — {path}"
    done = [_described(inp, i) for i in range(len(inp.history) - 1, -1, -1)[:LAST_ACTIONS]]
    return inp.instruction, page, "last actions: " + ("; ".join(done) or "none")


def _described(inp: RankerInput, i: int) -> str:
    target = inp.targets[i] if i < len(inp.targets) and inp.targets[i] else "element"
    text = re.sub(r"\b(?:f\d+)?e\d+\b", lambda _: target, inp.history[i], count=1)
    return text + (" (failed)" if inp.failed[i] else "")


@dataclass
class Encoded:
    """A prompt made ready for the scorer: context vectors ``ctx [3, D]``, candidate element and
    value vectors ``elem``/``value [C, D]`` and ``features [C, F]`` (numpy float32)."""

    candidates: list[Candidate]
    ctx: np.ndarray
    elem: np.ndarray
    value: np.ndarray
    features: np.ndarray


def encode_input(
    inp: RankerInput, encoder: TextEncoder | None = None, cands: list[Candidate] | None = None
) -> Encoded:
    """Candidates of a prompt (``cands``: already listed) and their embeddings (one encoder
    call, cached by text)."""
    enc = encoder or default_encoder()
    cands = candidates(inp) if cands is None else cands
    return encoded(cands, enc.encode(encoder_texts(inp, cands)))


def encoded(cands: list[Candidate], vec: np.ndarray) -> Encoded:
    """A prompt's :class:`Encoded` from its candidates and the vectors of its
    :func:`encoder_texts` (in that order)."""
    n = len(cands)
    value = vec[3 + n :].copy()
    value[[i for i, c in enumerate(cands) if not c.value]] = 0.0
    feats = np.array([c.features for c in cands], np.float32).reshape(n, N_FEATURES)
    return Encoded(cands, vec[:3], vec[3 : 3 + n], value, feats)


def encoder_texts(inp: RankerInput, cands: Sequence[Candidate]) -> list[str]:
    """The texts :func:`encode_input` embeds: 3 context texts, then each candidate's element,
    then each candidate's value."""
    return [
        *context_texts(inp),
        *(c.element for c in cands),
        *(c.value or "none" for c in cands),
    ]
