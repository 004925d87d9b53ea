"""The blob store on S3-compatible object storage (``WEBLOOP_BLOBS=s3://bucket/prefix``).

The same content addressing as the folder store (:class:`warehouse.blobs.BlobStore`): a blob
is the object ``prefix/ab/cd/abcd…`` named by the sha256 of its bytes. A put is one PUT of the
whole object (S3 never shows half an object), skipped when the object exists, so puts are
idempotent and machines writing the same screenshot store it once. Reads verify the hash and are
cached in a local folder by hash (a blob never changes, so the cache never goes stale). The
image check and the size accounting are the folder store's (:class:`warehouse.blobs.Blobs`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from warehouse.blobs import (
    BlobError,
    BlobNotFoundError,
    Blobs,
    BlobStore,
    PutResult,
    sha256_hex,
    shard_key,
    verified,
)
from warehouse.objectstore import S3Settings, is_object_url, split_url
from warehouse.secrets import redact

T = TypeVar("T")


class BlobStoreUnavailable(BlobError):
    """The object store did not answer (down, unreachable, refused the credentials)."""


class ObjectBlobStore(Blobs):
    """Blobs under ``url`` (``s3://bucket/prefix``), read through a local cache folder."""

    def __init__(
        self,
        url: str,
        cache: str | Path,
        settings: S3Settings | None = None,
        filesystem: Any = None,
    ) -> None:
        bucket, prefix = split_url(url)
        self.url = f"s3://{bucket}/{prefix}".rstrip("/")
        self._root = f"{bucket}/{prefix}".rstrip("/")
        self.cache = BlobStore(cache)
        self._settings = settings
        self._fs = filesystem

    @property
    def location(self) -> str:
        return self.url

    @property
    def fs(self) -> Any:
        """The s3fs filesystem, made on first use (opening a warehouse makes no request)."""
        if self._fs is None:
            self._fs = (self._settings or S3Settings.from_env()).filesystem()
        return self._fs

    def key(self, digest: str) -> str:
        """The object key of a blob (``bucket/prefix/ab/cd/abcd…``)."""
        return f"{self._root}/{shard_key(digest)}"

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except FileNotFoundError:
            raise
        except BlobError:
            raise
        except Exception as exc:  # botocore / aiohttp errors: the store did not answer
            raise BlobStoreUnavailable(
                f"blob store {self.url}: {what} failed: {redact(str(exc)) or type(exc).__name__}"
            ) from None

    def put(self, data: bytes) -> PutResult:
        digest = sha256_hex(data)
        if self.cache.exists(digest) or self._call(
            "a check", lambda: self.fs.exists(self.key(digest))
        ):
            return PutResult(digest, len(data), new=False)
        self._call(f"storing {digest}", lambda: self.fs.pipe_file(self.key(digest), data))
        self.cache.put(data)
        return PutResult(digest, len(data), new=True)

    def get(self, digest: str) -> bytes:
        key = self.key(digest)
        if self.cache.exists(digest):
            return self.cache.get(digest)
        try:
            data: bytes = self._call(f"reading {digest}", lambda: self.fs.cat_file(key))
        except FileNotFoundError:
            raise BlobNotFoundError(f"blob {digest} not found under {self.url}") from None
        self.cache.put(verified(digest, data, f"s3://{key}"))
        return data

    def exists(self, digest: str) -> bool:
        key = self.key(digest)
        return self.cache.exists(digest) or self._call("a check", lambda: self.fs.exists(key))

    def _listing(self) -> dict[str, Any]:
        def find() -> dict[str, Any]:
            try:
                return dict(self.fs.find(self._root, detail=True))
            except FileNotFoundError:
                return {}

        return self._call("listing", find)

    def __iter__(self) -> Iterator[str]:
        for key in self._listing():
            name = key.rsplit("/", 1)[-1]
            if len(name) == 64:
                yield name

    def stats(self) -> tuple[int, int]:
        n = size = 0
        for key, info in self._listing().items():
            if len(key.rsplit("/", 1)[-1]) == 64:
                n += 1
                size += int(info.get("size") or 0)
        return n, size

    def ping(self) -> None:
        """Raise :class:`BlobStoreUnavailable` unless the bucket answers."""
        bucket = self._root.split("/", 1)[0]
        try:
            self._call("a check of the bucket", lambda: self.fs.ls(bucket, detail=False))
        except FileNotFoundError:
            raise BlobStoreUnavailable(f"blob store {self.url}: no bucket {bucket!r}") from None


def open_blobs(location: str, home: Path) -> Blobs:
    """The blob store at ``location``: a folder, or an ``s3://`` URL (read through a cache
    of its own under ``home/cache/blobs/``)."""
    if is_object_url(location):  # a cache per store: a blob in it is a blob in that store
        return ObjectBlobStore(
            location, home / "cache" / "blobs" / sha256_hex(location.encode())[:16]
        )
    return BlobStore(location)
