"""The frozen MiniLM text encoder (:mod:`rollouts.encoder`): its caches, and vectors that do not
depend on what was encoded beside them."""

from __future__ import annotations

import random

import numpy as np
import pytest

from rollouts.encoder import DIM, TextEncoder


def test_encoder_caches_in_memory_lru_and_on_disk(tmp_path) -> None:
    enc = TextEncoder(max_items=2, cache_dir=tmp_path / "emb")
    v = enc.encode(["Accept all", "Search flights", "Accept all"])
    assert v.shape == (3, DIM) and v.dtype == np.float32
    assert np.array_equal(v[0], v[2]) and enc.misses == 2 and enc.hits == 0
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    enc.encode(["Reject optional"])  # evicts "Accept all" from memory (LRU of 2) ...
    assert len(enc) == 2
    enc.encode(["Accept all"])  # ... but the disk shard still holds it
    assert enc.misses == 3
    assert enc.flush() >= 1
    warm = TextEncoder(cache_dir=tmp_path / "emb")
    again = warm.encode(["Accept all", "Search flights"])
    assert warm.misses == 0 and warm.hits == 2
    assert np.array_equal(again, v[:2])
    assert warm.encode([]).shape == (0, DIM)
    with pytest.raises(TypeError):
        warm.encode("Accept all")


def test_a_texts_vector_barely_depends_on_what_was_encoded_beside_it() -> None:
    """The same text alone, in a batch of others (shorter, longer, the same token count), at any
    position and under 1 or 2 threads: the vectors agree to float32 noise (kernel paths depend
    on the batch shape, the thread count and the CPU, so not always to the bit), and
    :meth:`TextEncoder.encode_fresh` gives the bits of one canonical call whatever was cached
    (what the trainer reads: the same rows and seed give the same checkpoint)."""
    import torch

    from rollouts.encoder import TextEncoder, encode_uncached

    rng = random.Random(7)
    words = ["add", "the", "blue", "kettle", "to", "cart", "search", "flights", "Ripeel", "Mia"]
    texts = sorted({" ".join(rng.choices(words, k=rng.randint(1, 40))) for _ in range(300)})
    probes = [*texts[::37], "Accept all", "link Checkout — /cart"]
    alone = {t: encode_uncached([t])[0] for t in probes}
    threads = torch.get_num_threads()
    try:
        for n in (2, 1):
            torch.set_num_threads(n)
            mixed = texts + probes
            rng.shuffle(mixed)
            vecs = encode_uncached(mixed)
            for t in probes:
                np.testing.assert_allclose(vecs[mixed.index(t)], alone[t], rtol=0, atol=2e-6)
    finally:
        torch.set_num_threads(threads)
    cold, warm = TextEncoder(), TextEncoder()
    warm.encode(texts)  # vectors computed beside 300 other texts
    fresh = warm.encode_fresh(probes)
    assert np.array_equal(fresh, cold.encode_fresh(probes))
    assert np.array_equal(warm.encode(probes), fresh)  # and cached for encode()
    # and the vectors are MiniLM's: a text is nearer to itself reworded than to another text
    a, b, c = encode_uncached(
        [
            "Add the blue kettle to the cart",
            "Put the blue kettle into your cart",
            "Reply to Mia Kim",
        ]
    )
    assert float(a @ b) > 0.8 > float(a @ c)


def test_a_trainer_s_vectors_do_not_depend_on_what_the_process_encoded_before(monkeypatch):
    """:meth:`TextEncoder.encode_exact` (what the ranker's trainer reads): the same bits from a
    cold encoder and from one that encoded the texts before among others, whichever way this
    CPU answers :func:`batch_invariant`; where it answers yes, the cache serves the trainer (no
    text encoded twice), where no, the vectors are computed afresh."""
    import rollouts.encoder as module

    rng = random.Random(3)
    words = ["open", "the", "newest", "mail", "from", "Alice", "reply", "Oslo", "e12", "Mia"]
    texts = sorted({" ".join(rng.choices(words, k=rng.randint(1, 30))) for _ in range(120)})
    probes = texts[::11]
    cold_bits = TextEncoder().encode_exact(probes)
    warm = TextEncoder()
    warm.encode(texts)  # the probes computed beside 110 other texts
    misses = warm.misses
    assert np.array_equal(warm.encode_exact(probes), cold_bits)
    assert warm.misses == misses + (0 if module.batch_invariant() else len(probes))
    if module.batch_invariant():  # then it holds for a batch the probe did not try, too
        mixed = [*texts[5:60], *probes]
        rng.shuffle(mixed)
        vecs = module.encode_uncached(mixed)
        for t in probes:
            assert np.array_equal(vecs[mixed.index(t)], module.encode_uncached([t])[0])
    monkeypatch.setattr(module, "batch_invariant", lambda: False)  # a CPU where bits move
    hits = warm.hits
    assert np.array_equal(warm.encode_exact(probes), cold_bits) and warm.hits == hits
    disk = TextEncoder(cache_dir="unused")  # a disk cache may hold another machine's bits
    monkeypatch.setattr(module, "batch_invariant", lambda: True)
    disk.encode_exact(probes[:2])
    assert disk.hits == 0 and disk.misses == 2
