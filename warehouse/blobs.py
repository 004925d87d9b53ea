"""Content-addressed blob store for screenshots, accessibility trees, prompts and long texts.

A blob is named by the sha256 of its bytes and stored at ``root/ab/cd/abcd…`` (two levels of
sharding keep folders small). Writes are atomic (temp file + rename) and deduplicated: putting
the same bytes twice stores one file. Reads verify the hash; bytes that no longer match it raise
:class:`BlobCorruptError` naming the blob and its path.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from warehouse.images import validate_image


class BlobError(RuntimeError):
    """Base of blob store errors."""


class BlobNotFoundError(BlobError, KeyError):
    """No blob with this hash is in the store."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class BlobCorruptError(BlobError):
    """A stored blob's bytes no longer hash to its name."""


class NotAnImageError(BlobError, ValueError):
    """Bytes offered as an image (a screenshot) are not one; the message says why."""


@dataclass(frozen=True)
class PutResult:
    hash: str
    size: int
    new: bool  # False when the blob was already stored (deduplicated)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_digest(digest: str) -> str:
    """``digest`` when it is a sha256 hex digest; else :class:`BlobError`."""
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise BlobError(f"not a sha256 hex digest: {digest!r}")
    return digest


def verified(digest: str, data: bytes, where: str) -> bytes:
    """``data`` when it hashes to ``digest``; else :class:`BlobCorruptError` naming ``where``."""
    actual = sha256_hex(data)
    if actual != digest:
        raise BlobCorruptError(f"blob {digest} is corrupt: its bytes at {where} hash to {actual}")
    return data


def shard_key(digest: str) -> str:
    """A blob's place below the store's root: ``ab/cd/abcd…``."""
    return f"{digest[:2]}/{digest[2:4]}/{check_digest(digest)}"


class Blobs(ABC):
    """What every blob store offers beside :meth:`put`, :meth:`get`, ``__iter__`` and
    :meth:`stats` (a folder: :class:`BlobStore`; object storage:
    :class:`warehouse.objectblobs.ObjectBlobStore`)."""

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the blobs are (a folder, an ``s3://`` URL)."""

    @abstractmethod
    def put(self, data: bytes) -> PutResult:
        """Store ``data``; return its hash. Atomic, and a no-op when already stored."""

    @abstractmethod
    def get(self, digest: str) -> bytes:
        """The blob's bytes, verified against its hash."""

    @abstractmethod
    def exists(self, digest: str) -> bool: ...

    @abstractmethod
    def __iter__(self) -> Iterator[str]:
        """The hashes of the stored blobs."""

    @abstractmethod
    def stats(self) -> tuple[int, int]:
        """(number of blobs, total bytes)."""

    @abstractmethod
    def ping(self) -> None:
        """Raise unless the store can be reached (``webloop warehouse info``'s check)."""

    def put_image(self, data: bytes) -> PutResult:
        """Store a screenshot: like :meth:`put`, after checking that ``data`` is a whole image.

        Raises :class:`NotAnImageError` (and stores nothing) for bytes that are not a PNG, JPEG
        or WebP image (see :func:`warehouse.images.validate_image`).
        """
        reason = validate_image(data)
        if reason is not None:
            raise NotAnImageError(f"not storing a screenshot of {len(data)} bytes: {reason}")
        return self.put(data)

    def put_text(self, text: str) -> PutResult:
        return self.put(text.encode("utf-8"))

    def get_text(self, digest: str) -> str:
        return self.get(digest).decode("utf-8")

    def verify(self) -> list[str]:
        """Hashes of all corrupt blobs in the store (empty when all are intact)."""
        bad = []
        for digest in self:
            try:
                self.get(digest)
            except BlobCorruptError:
                bad.append(digest)
        return bad


class BlobStore(Blobs):
    """A folder of blobs addressed by sha256."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @property
    def location(self) -> str:
        return str(self.root)

    def path(self, digest: str) -> Path:
        """Where the blob ``digest`` lives (whether or not it exists)."""
        return self.root / shard_key(digest)

    def put(self, data: bytes) -> PutResult:
        """Store ``data``; return its hash. Atomic, and a no-op when already stored."""
        digest = sha256_hex(data)
        target = self.path(digest)
        if target.exists():
            return PutResult(digest, len(data), new=False)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return PutResult(digest, len(data), new=True)

    def get(self, digest: str) -> bytes:
        """The blob's bytes, verified against its hash."""
        path = self.path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise BlobNotFoundError(f"blob {digest} not found under {self.root}") from None
        return verified(digest, data, str(path))

    def exists(self, digest: str) -> bool:
        return self.path(digest).exists()

    def __iter__(self) -> Iterator[str]:
        if not self.root.exists():
            return
        for path in self.root.glob("??/??/*"):
            if not path.name.startswith(".tmp-"):
                yield path.name

    def ping(self) -> None:
        if self.root.exists() and not self.root.is_dir():  # absent: none stored yet
            raise BlobError(f"{self.root} is not a folder")

    def stats(self) -> tuple[int, int]:
        """(number of blobs, total bytes)."""
        n = size = 0
        for digest in self:
            n += 1
            size += self.path(digest).stat().st_size
        return n, size
