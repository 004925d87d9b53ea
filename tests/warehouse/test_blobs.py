"""Content-addressed blob store: dedup, atomic writes, corruption detection."""

from __future__ import annotations

import hashlib

import pytest

from warehouse.blobs import BlobCorruptError, BlobError, BlobNotFoundError, BlobStore


def test_put_get_and_deduplicate(tmp_path):
    store = BlobStore(tmp_path / "blobs")
    a = store.put(b"screenshot bytes")
    assert a.hash == hashlib.sha256(b"screenshot bytes").hexdigest() and a.new
    b = store.put(b"screenshot bytes")
    assert b.hash == a.hash and not b.new
    assert store.get(a.hash) == b"screenshot bytes"
    assert store.stats() == (1, len(b"screenshot bytes"))
    path = store.path(a.hash)
    assert path.parent.name == a.hash[2:4] and path.parent.parent.name == a.hash[:2]
    assert not list(path.parent.glob(".tmp-*"))  # no temp files left behind
    assert store.get_text(store.put_text("ünï").hash) == "ünï"


def test_corruption_is_reported_on_read_and_by_verify(tmp_path):
    store = BlobStore(tmp_path)
    good = store.put(b"good").hash
    bad = store.put(b"will rot").hash
    store.path(bad).write_bytes(b"rotted")
    with pytest.raises(BlobCorruptError, match=bad):
        store.get(bad)
    assert store.verify() == [bad]
    assert store.get(good) == b"good"


def test_missing_and_invalid_hashes(tmp_path):
    store = BlobStore(tmp_path)
    with pytest.raises(BlobNotFoundError, match="not found"):
        store.get("0" * 64)
    with pytest.raises(BlobError, match="not a sha256"):
        store.get("../../etc/passwd")
