"""A tiny model implementing :class:`training.interface.TrainablePolicy` for trainer tests.

Its reply space is a fixed list of completions (a toy categorical "action" vocabulary); a prompt
is hashed into one of a few buckets, embedded, passed through dropout and scored against every
reply. ``logprob`` is the log-softmax of the turn's completion (``n_tokens`` = 1, like the
ranker); a completion outside the vocabulary is ``covered = False``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from training.interface import DataMismatch, Turn, TurnLogprobs

REPLIES = (
    "Action: click(e1)",
    "Action: click(e2)",
    "Action: scroll(down)",
    'Action: press("Enter")',
)


class ToyModule(torch.nn.Module):
    def __init__(self, n_buckets: int, n_replies: int, dim: int, dropout: float) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(n_buckets, dim)
        self.drop = torch.nn.Dropout(dropout)
        self.head = torch.nn.Linear(dim, n_replies)

    def forward(self, buckets: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.head(self.drop(self.embed(buckets))), dim=-1)


class ToyPolicy:
    kind = "toy"

    def __init__(self, seed: int = 0, n_buckets: int = 64, dim: int = 8, dropout: float = 0.1):
        gen_state = torch.get_rng_state()
        torch.manual_seed(seed)
        self.n_buckets = n_buckets
        self.module = ToyModule(n_buckets, len(REPLIES), dim, dropout)
        torch.set_rng_state(gen_state)
        self.calls = 0

    def bucket(self, prompt: str) -> int:
        return int(hashlib.sha256(prompt.encode()).hexdigest(), 16) % self.n_buckets

    def parameters(self):
        return self.module.parameters()

    def train(self, mode: bool = True):
        self.module.train(mode)
        return self

    def logprobs(self, batch: Sequence[Turn]) -> TurnLogprobs:
        self.calls += 1
        buckets = torch.tensor([self.bucket(t.prompt) for t in batch])
        logp = self.module(buckets)
        covered = torch.tensor([t.completion in REPLIES for t in batch])
        idx = torch.tensor(
            [REPLIES.index(t.completion) if t.completion in REPLIES else 0 for t in batch]
        )
        picked = logp.gather(1, idx[:, None])[:, 0]
        return TurnLogprobs(
            logprob=torch.where(covered, picked, picked * 0.0),
            n_tokens=torch.ones(len(batch)),
            covered=covered,
        )

    def logprob_of(self, prompt: str, completion: str) -> float:
        """Eval-mode log-prob of one reply (for assertions)."""
        was = self.module.training
        self.module.eval()
        with torch.no_grad():
            lp = self.logprobs([Turn(prompt=prompt, completion=completion)]).logprob[0]
        self.module.train(was)
        return float(lp)

    def check_data(self, turns: Sequence[Turn]) -> None:
        for i, t in enumerate(turns):
            if not t.prompt:
                raise DataMismatch(f"toy: turn {i} ({t.key!r}) has an empty prompt")

    def save(self, path: Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        torch.save(self.module.state_dict(), path / "toy.pt")
        (path / "config.json").write_text(
            json.dumps({"kind": self.kind, "n_buckets": self.n_buckets})
        )
