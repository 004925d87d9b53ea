"""S3-compatible object storage: where a team's data files and blobs live.

A warehouse's DuckLake data path (``WEBLOOP_DATA_PATH=s3://bucket/prefix/``) and its blob store
(``WEBLOOP_BLOBS=s3://bucket/prefix``) may be on S3 or any service that speaks its protocol
(MinIO, Ceph, R2…). :class:`S3Settings` resolves how to reach it the way the AWS tools do:

- credentials: botocore's chain (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
  ``AWS_SESSION_TOKEN``, then the profile ``AWS_PROFILE`` names in ``~/.aws/credentials`` and
  ``~/.aws/config``; none: anonymous requests);
- region: ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` / the profile's (default ``us-east-1``);
- endpoint: ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (an S3-compatible service; unset: AWS);
- URL style: ``WEBLOOP_S3_URL_STYLE`` (``path`` or ``vhost``; default ``path`` with an endpoint,
  ``vhost`` on AWS);
- retries of the blob store's requests: botocore's (``AWS_MAX_ATTEMPTS``, ``AWS_RETRY_MODE``);
  DuckDB's httpfs retries data-file requests on its own (``http_retries``).

Credentials are never written anywhere: DuckDB gets them as a temporary (in-memory) secret, whose
``duckdb_secrets()`` row is redacted; the blob store's client holds them in memory; both values
are registered with :mod:`warehouse.secrets`, so no error message, log line or row shows them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from warehouse.secrets import register
from warehouse.sqltext import sql_string

SCHEMES = ("s3://", "s3a://", "s3n://")
URL_STYLES = ("path", "vhost")
DEFAULT_REGION = "us-east-1"


class ObjectStoreError(RuntimeError):
    """Object storage that cannot be used: bad settings, or a service that does not answer."""


def is_object_url(location: str) -> bool:
    """Whether ``location`` names S3-compatible storage (``s3://…``), not a local folder."""
    return location.startswith(SCHEMES)


def split_url(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b/`` → ``("bucket", "a/b")``; raises :class:`ObjectStoreError` for a URL
    without a bucket."""
    parts = urlsplit(url)
    if not is_object_url(url) or not parts.netloc:
        raise ObjectStoreError(f"{url!r} is not an s3://bucket/prefix URL")
    return parts.netloc, parts.path.strip("/")


@dataclass(frozen=True)
class S3Settings:
    """How to reach S3-compatible storage (see the module docstring for the variables)."""

    region: str
    endpoint_url: str | None  # "http://127.0.0.1:9000"; None: AWS itself
    url_style: str
    key_id: str | None = field(default=None, repr=False)
    secret: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls) -> S3Settings:
        """Settings from the environment and the AWS profile files; the secret values are
        registered with :mod:`warehouse.secrets` (masked in everything stored or logged)."""
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint and urlsplit(endpoint).scheme not in ("http", "https"):
            raise ObjectStoreError(
                f"AWS_ENDPOINT_URL={endpoint!r}: an endpoint is an http:// or https:// URL"
            )
        style = os.environ.get("WEBLOOP_S3_URL_STYLE") or ("path" if endpoint else "vhost")
        if style not in URL_STYLES:
            raise ObjectStoreError(f"WEBLOOP_S3_URL_STYLE={style!r}: use one of {URL_STYLES}")
        key, secret, token, region = _aws_chain()
        for value in (secret, token):
            register(value)
        return cls(region, endpoint, style, key, secret, token)

    @property
    def use_ssl(self) -> bool:
        return self.endpoint_url is None or self.endpoint_url.startswith("https://")

    def duckdb_secret_sql(self, name: str, scope: str) -> str:
        """``CREATE TEMPORARY SECRET`` for DuckDB's httpfs, scoped to ``scope`` (a bucket URL).
        The statement holds the credentials: run it, never log it."""
        opts = [
            "TYPE s3",
            f"REGION {sql_string(self.region)}",
            f"URL_STYLE {sql_string(self.url_style)}",
            f"USE_SSL {str(self.use_ssl).lower()}",
            f"SCOPE {sql_string(scope)}",
        ]
        if self.endpoint_url:
            opts.append(f"ENDPOINT {sql_string(urlsplit(self.endpoint_url).netloc)}")
        if self.key_id and self.secret:
            opts += [f"KEY_ID {sql_string(self.key_id)}", f"SECRET {sql_string(self.secret)}"]
        if self.session_token:
            opts.append(f"SESSION_TOKEN {sql_string(self.session_token)}")
        return f"CREATE OR REPLACE TEMPORARY SECRET {name} ({', '.join(opts)})"

    def filesystem(self) -> Any:
        """An ``s3fs.S3FileSystem`` with these settings (no listing cache: other machines
        write the same bucket)."""
        try:
            import s3fs
        except ImportError as exc:  # pragma: no cover - s3fs is a dependency
            raise ObjectStoreError("object storage needs s3fs: pip install s3fs") from exc
        return s3fs.S3FileSystem(
            key=self.key_id,
            secret=self.secret,
            token=self.session_token,
            anon=not (self.key_id and self.secret),
            endpoint_url=self.endpoint_url,
            client_kwargs={"region_name": self.region},
            config_kwargs={
                "s3": {"addressing_style": "path" if self.url_style == "path" else "virtual"},
                "connect_timeout": 5,
                "read_timeout": 30,
            },
            use_listings_cache=False,
            skip_instance_cache=True,
        )


def _aws_chain() -> tuple[str | None, str | None, str | None, str]:
    """(key id, secret, session token, region) from botocore's credential chain."""
    import botocore.session

    try:
        session = botocore.session.Session(profile=os.environ.get("AWS_PROFILE") or None)
        creds = session.get_credentials()
        region = session.get_config_variable("region")
    except Exception as exc:  # botocore's profile errors
        raise ObjectStoreError(f"cannot read the AWS settings: {exc}") from None
    region = os.environ.get("AWS_REGION") or region or DEFAULT_REGION
    if creds is None:
        return None, None, None, region
    frozen = creds.get_frozen_credentials()
    return frozen.access_key, frozen.secret_key, frozen.token, region
