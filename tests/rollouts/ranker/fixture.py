"""What the ranker's tests share: a snapshot and an instruction of the bundled sites' kind, a
fast stand-in for the encoder, the prompt the rollout engine would build from them, and the
bundled tasks and engine run of the live-page tests."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from rollouts.encoder import DIM, TextEncoder
from rollouts.engine import Finished
from rollouts.prompts import PromptConfig, Turn, build_messages
from sites.tasks import generate
from tests.rollouts.engine_runner import run_on_chromium

TREE = """- generic [active] [ref=e1]:
  - main [ref=e6]:
    - heading "Search flights" [level=1] [ref=e7]
    - textbox "From" [ref=e11]:
      - /placeholder: City or airport
      - text: Mias (MIA)
    - textbox "Departure date" [ref=e19]
    - combobox "Stops" [ref=e13]:
      - option "Any" [selected]
      - option "Nonstop only"
    - table [ref=e17]:
      - row [ref=e27]:
        - cell "Skyline" [ref=e28]
        - cell "$69" [ref=e33]
        - cell [ref=e34]:
          - link "Select" [ref=e35] [cursor=pointer]:
            - /url: /book/1
    - paragraph [ref=e16]: "★ 3.6 (3 reviews) · Brand: Brightwell · Category: Outdoor"
    - 'link "Budget review #31" [ref=e40] [cursor=pointer]':
      - /url: /message/m1
    - checkbox "Vacation responder on" [ref=e25]
    - button "Search flights" [ref=e20] [cursor=pointer]"""
INSTRUCTION = (
    "Book the cheapest flight from Mias to Videl on 2026-06-17 for Ada Hopper "
    '(ada.hopper@example.net), 2 seats, note "window please".'
)


class HashEncoder(TextEncoder):
    """A deterministic stand-in for MiniLM (unit vectors seeded by the text's hash): fast tests
    of everything but the encoder."""

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = []
        for t in texts:
            seed = int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)
            v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
            out.append(v / np.linalg.norm(v))
        return np.stack(out) if out else np.zeros((0, DIM), np.float32)

    def encode_fresh(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode(texts)

    def encode_exact(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode(texts)


PAGE = ("http://127.0.0.1:5/flights?x=1", "Farefinder — search")


def messages(
    history: list[str] | None = None,
    tree: str = TREE,
    error: str | None = None,
    page: tuple[str, str] = PAGE,
):
    """The prompt at :data:`PAGE` (``tree``) after ``history``, each action taken on ``page``
    (this one by default) with ``tree`` as its page's snapshot."""
    turns = [Turn(*page, a11y=tree, action_text=a, error=error) for a in history or []]
    turns.append(Turn(*PAGE, a11y=tree))
    return build_messages(INSTRUCTION, turns, PromptConfig(mode="a11y"))


# -- real snapshots of the bundled sites --------------------------------------------------------

TEMPLATES = ["shop_add_to_cart", "wiki_twin_city", "mail_reply", "travel_book_cheapest"]


def bundled_tasks() -> list[Any]:
    """One generated task of each of :data:`TEMPLATES`."""
    seen: dict[str, Any] = {}
    for t in generate(120, seed=5):
        seen.setdefault(t.meta["template"], t)
    return [seen[k] for k in TEMPLATES]


def run(
    chromium: Any, server: Any, policy: Any, tasks: list[Any], max_steps: int
) -> list[Finished]:
    """``tasks`` played by ``policy`` in real Chromium on the bundled sites (4 at a time)."""
    return run_on_chromium(
        chromium, server, policy, tasks, run_id="ranker-test", concurrency=4, max_steps=max_steps
    )
