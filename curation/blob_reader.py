"""Screenshots and accessibility trees read from the blob store for the example renderer.

Each blob is read, hashed and validated once per chunk (a byte-bounded LRU), and whether it
exists and is usable is recorded for the quality gates (:meth:`BlobReader.frame`).
"""

from __future__ import annotations

from collections import OrderedDict

import polars as pl

from warehouse.blobs import BlobError, Blobs
from warehouse.images import validate_image


class BlobReader:
    """Reads screenshots and trees for one chunk; records whether each exists and is usable.

    The cache is an LRU bounded by bytes (``cache_bytes``), not by entries: a chunk's working
    set (every distinct screen and tree it shows) must fit, or every prompt re-reads, re-hashes
    and re-validates its blobs (measured on bench/curation.py: 600 distinct small blobs against
    a 256-entry cap read 27k blobs from disk for 34k examples)."""

    def __init__(self, store: Blobs, cache_bytes: int = 128 << 20) -> None:
        self.store = store
        self.cache: OrderedDict[str, bytes | None] = OrderedDict()  # LRU: bounded memory
        self.cache_bytes = cache_bytes
        self.cached = 0  # bytes held by the cache
        self.checks: dict[str, tuple[str, bool, str | None]] = {}

    def clear(self) -> None:
        self.cache.clear()
        self.cached = 0

    def get(self, digest: str | None, role: str) -> bytes | None:
        if not digest:
            return None
        if digest in self.cache:
            self.cache.move_to_end(digest)
            return self.cache[digest]
        try:
            data: bytes | None = self.store.get(digest)
            exists, reason = True, None
        except BlobError as exc:  # missing, corrupt, or not a digest
            data, exists, reason = None, False, str(exc)
        if data is not None and role == "screenshot":
            reason = validate_image(data)
            if reason is not None:
                data = None
        elif data is not None:
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                data, reason = None, "not UTF-8 text"
        self.cache[digest] = data
        self.cached += len(data or b"")
        while self.cached > self.cache_bytes and len(self.cache) > 1:
            _, old = self.cache.popitem(last=False)
            self.cached -= len(old or b"")
        self.checks.setdefault(digest, (role, exists, reason))
        return data

    def frame(self) -> pl.DataFrame:
        rows = [
            {"hash": h, "role": r, "exists": e, "reason": why}
            for h, (r, e, why) in sorted(self.checks.items())
        ]
        schema = {"hash": pl.Utf8, "role": pl.Utf8, "exists": pl.Boolean, "reason": pl.Utf8}
        return pl.DataFrame(rows, schema=schema)
