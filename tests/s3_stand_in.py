"""A local server that speaks the S3 protocol, for the object-storage tests.

moto's standalone server (``moto[server]``) stands in for S3 or MinIO, which cannot run here: a
real HTTP server on loopback that DuckDB's httpfs, s3fs and boto3 talk to as they would to S3.
Its buckets live in this process, so :meth:`S3StandIn.stop` then :meth:`S3StandIn.start` is an
outage and a recovery of the same storage (same port, same objects).
"""

from __future__ import annotations

from typing import Any

MARKER_SECRET = "webloop-marker-secret-5b1e7c"
"""The secret access key the tests use: it must never appear in anything webloop writes."""


class S3StandIn:
    """moto's S3 server on ``127.0.0.1`` with one bucket, and the environment that points the
    AWS tools (and webloop) at it."""

    def __init__(self, bucket: str = "team") -> None:
        self.bucket = bucket
        self.port = 0
        self._server: Any = None

    def start(self) -> S3StandIn:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        self.port = self._server.get_host_and_port()[1]
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> S3StandIn:
        self.start()
        self.client().create_bucket(Bucket=self.bucket)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": "AKIAWEBLOOPTEST",
            "AWS_SECRET_ACCESS_KEY": MARKER_SECRET,
            "AWS_ENDPOINT_URL": self.url,
            "AWS_REGION": "us-east-1",
            "AWS_MAX_ATTEMPTS": "1",  # an outage is reported at once, not after botocore's backoff
        }

    def client(self) -> Any:
        import boto3

        env = self.env
        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name=env["AWS_REGION"],
        )

    def keys(self, prefix: str = "") -> list[str]:
        pages = (
            self.client()
            .get_paginator("list_objects_v2")
            .paginate(Bucket=self.bucket, Prefix=prefix)
        )
        return sorted(o["Key"] for p in pages for o in p.get("Contents", []))

    def read(self, key: str) -> bytes:
        return self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read()
