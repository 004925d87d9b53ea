"""Offline MiniLM embeddings and near-duplicate detection (curation/embed.py)."""

from __future__ import annotations

import numpy as np

from curation.embed import DEFAULT_THRESHOLD, DIM, embed, near_duplicates

ORIGINAL = "Add the blue kettle to the cart"
REWORDED = "Put the blue kettle into your cart"
SAME_TEMPLATE_OTHER_ITEM = "Add the red toaster to the cart"
UNRELATED = "Book a flight from Paris to Rome on May 3"


def test_embed_shape_norm_and_cache() -> None:
    v = embed([ORIGINAL, UNRELATED, ORIGINAL])
    assert v.shape == (3, DIM) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    # Same text → the very same vector (cache by text hash), different text → different.
    assert np.array_equal(v[0], v[2])
    assert float(v[0] @ v[1]) < 0.5
    assert embed([]).shape == (0, DIM)


def test_rewording_is_near_duplicate_unrelated_is_not() -> None:
    texts = [ORIGINAL, REWORDED, SAME_TEMPLATE_OTHER_ITEM, UNRELATED]
    v = embed(texts)
    sims = v @ v.T
    # measured here: 1.0, 0.936, 0.461, 0.022
    print({t: round(float(sims[0, i]), 3) for i, t in enumerate(texts)})
    pairs = near_duplicates(texts, None, DEFAULT_THRESHOLD)
    assert [(i, j) for i, j, _ in pairs] == [(0, 1)]
    assert pairs[0][2] >= DEFAULT_THRESHOLD
    assert abs(pairs[0][2] - float(sims[0, 1])) < 1e-6


def test_near_duplicates_across_two_lists() -> None:
    train = [UNRELATED, ORIGINAL, "Find the wiki article about volcanoes"]
    test = [SAME_TEMPLATE_OTHER_ITEM, REWORDED, UNRELATED]
    pairs = near_duplicates(train, test, DEFAULT_THRESHOLD)
    # train[0] == test[2] exactly (1.0); train[1] ~ test[1] (rewording); nothing else.
    assert [(i, j) for i, j, _ in pairs] == [(0, 2), (1, 1)]
    assert abs(pairs[0][2] - 1.0) < 1e-5
    # A lower threshold lets the same-template other-item pair in too.
    loose = {(i, j) for i, j, _ in near_duplicates(train, test, 0.4)}
    assert (1, 0) in loose
    assert near_duplicates([], test, 0.5) == []
