"""A remote OUT on S3 (or an S3 API server such as MinIO): its URL, its object names, and the few object
operations push, pull and status need, through boto3 (the optional extra ``zerogr[s3]``, imported lazily).

Layout (docs/bundle-format.md, "Remote OUT"): ``s3://bucket/prefix/LATEST`` and
``s3://bucket/prefix/vNNNNNN/<file>`` exactly as in a local OUT, plus ``vNNNNNN/.claim``, the create-only
object that reserves a version number.

Credentials and the endpoint come only from the standard AWS environment (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_ENDPOINT_URL``, ``AWS_REGION``, profiles); they are
never printed, logged or stored. Errors become one line naming the object: `RemoteAccessError` (exit 2:
fix the configuration), `RemoteError` (exit 3: the store could not be reached or failed; retry later).

Why boto3 and not pyarrow's S3 filesystem for the bundle files: pyarrow's input streams issue one ranged
GET per read call, so streaming a file in bounded chunks costs one request per chunk (measured 10x slower
than one streaming GET against a local S3 server); boto3 streams one GET per object in chunks of any size,
and it does the conditional writes (If-None-Match, If-Match) that claims and LATEST need.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, BinaryIO

from ..base.errors import BundleError, InputError, ZerogrError, one_line
from ..base.printable import printable, safe_text
from ..base.redact import redact, redact_url
from ..bundle.format import (
    LATEST_NAME,
    MANIFEST_NAME,
    MAX_VERSION,
    oversized_version_dir,
    parse_version_dir,
    shown_version_dir,
    version_dir_name,
)

CLAIM_NAME = ".claim"
STREAM_CHUNK = 1 << 20
#: Objects listed under one remote OUT before the listing is refused (a remote OUT holds a few versions
#: of a few dozen files each).
MAX_LISTED_OBJECTS = 200_000
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]\Z")
_CONFIG_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "NoSuchBucket",
        "InvalidBucketName",
        "AuthorizationHeaderMalformed",
        "ExpiredToken",
        "InvalidToken",
    }
)


def _client_error(where: str, exc: Any) -> ZerogrError:
    """The zerogr error for a botocore ClientError: a failed condition, a configuration problem (exit 2)
    or a store failure to retry (exit 3)."""
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    if code in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
        return PreconditionFailed(where)
    if code in _CONFIG_CODES:
        return RemoteAccessError(f"{where}: {code} ({redact(error.get('Message', ''))})")
    return RemoteError(f"{where}: {code or 'error'} ({redact(error.get('Message', ''))})")


class RemoteError(ZerogrError):
    """The object store could not be reached or failed a request (network, throttling, 5xx): retry later."""

    exit_code = 3


class RemoteAccessError(InputError):
    """The remote OUT cannot be used as configured (no credentials, access denied, no such bucket)."""


class RefusedRemoteVersion(BundleError):
    """A remote version (or the local one being pushed) is incomplete, corrupt or breaks the trust rules."""

    exit_code = 4


class NothingPublished(ZerogrError):
    """The remote OUT has no LATEST yet, or the version asked for does not exist."""

    exit_code = 5


class PreconditionFailed(Exception):
    """A conditional write lost: the object exists (If-None-Match) or changed (If-Match)."""


@dataclass(frozen=True)
class RemoteObject:
    """One listed object: its name relative to the remote OUT, size in bytes and last-modified time."""

    name: str
    size: int
    modified: datetime


@dataclass(frozen=True)
class RemoteOut:
    """``s3://bucket/prefix``: the bucket and the key prefix ('' for the bucket's root), both checked."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> RemoteOut:
        """Parse and check an ``s3://bucket[/prefix]`` URL; InputError (exit 2) naming it otherwise."""
        shown = safe_text(redact_url(url))  # never past the path: a query or fragment may hold a secret
        if not isinstance(url, str) or not url.startswith("s3://"):
            raise InputError(f"{shown}: not an s3:// URL (expected s3://bucket/prefix)")
        if "@" in url or "?" in url or "#" in url:
            raise InputError(
                f"{shown}: credentials, a query or a fragment in an s3:// URL are refused; credentials come "
                "from the standard AWS environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, a profile)"
            )
        bucket, _, prefix = url[len("s3://") :].partition("/")
        if not _BUCKET_RE.match(bucket):
            raise InputError(f"{shown}: {bucket!r} is not a valid bucket name")
        prefix = prefix.strip("/")
        parts = prefix.split("/") if prefix else []
        if any(p in ("", ".", "..") for p in parts) or printable(prefix) != prefix or "\\" in prefix:
            raise InputError(
                f"{shown}: the prefix must be plain /-separated names (no '..', '.', '//', control chars)"
            )
        if parts and parse_version_dir(parts[-1]) is not None:
            raise InputError(f"{shown}: names a version, not a remote OUT (drop the /{parts[-1]})")
        return cls(bucket, prefix)

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def key(self, name: str) -> str:
        """The object key of `name` (relative to the remote OUT, e.g. "v000003/manifest.json")."""
        return f"{self.prefix}/{name}" if self.prefix else name

    def name_url(self, name: str) -> str:
        """The URL of `name`, for messages."""
        return f"{self.url}/{name}"


def parse_version_url(url: str) -> tuple[RemoteOut, int]:
    """``s3://bucket/prefix/vNNNNNN`` -> (the remote OUT, N); InputError (exit 2) naming it otherwise, and
    RefusedRemoteVersion (exit 4) for a version number past MAX_VERSION (a stray or hostile object)."""
    head, _, last = str(url).rstrip("/").rpartition("/")
    number = parse_version_dir(last)
    if oversized_version_dir(last) and head.startswith("s3://"):
        RemoteOut.parse(head)
        raise RefusedRemoteVersion(f"{safe_text(head)}/{oversized_note(last)}")
    if number is None or not head.startswith("s3://"):
        raise InputError(
            f"{safe_text(redact_url(url))}: not a remote version (expected s3://bucket/prefix/vNNNNNN)"
        )
    return RemoteOut.parse(head), number


def is_remote(target: str) -> bool:
    """True for an s3:// URL (a remote OUT), False for a local path."""
    return isinstance(target, str) and target.startswith("s3://")


def version_name(version: int, name: str) -> str:
    """The remote OUT-relative name of file `name` of version `version`."""
    return f"{version_dir_name(version)}/{name}"


def _boto3() -> Any:
    try:
        import boto3
        import botocore  # noqa: F401
    except ImportError:
        raise InputError("s3:// needs boto3: pip install 'zerogr[s3]' (or pip install boto3)") from None
    return boto3


class S3Store:
    """The object operations on one remote OUT. Thread-safe (one boto3 client, which is)."""

    def __init__(self, remote: RemoteOut, client: Any = None):
        self.remote = remote
        if client is None:
            boto3 = _boto3()
            from botocore.config import Config

            attempts = int(os.environ.get("AWS_MAX_ATTEMPTS") or 5)  # the standard variable wins
            config = Config(retries={"max_attempts": attempts, "mode": "standard"}, max_pool_connections=16)
            client = boto3.session.Session().client("s3", config=config)
        self.client = client

    # -- errors

    @contextlib.contextmanager
    def _errors(self, name: str) -> Iterator[None]:
        """Turn boto3/botocore errors into one-line zerogr errors naming the object (never credentials)."""
        from botocore import exceptions as bx

        where = self.remote.name_url(name) if name else self.remote.url
        try:
            yield
        except bx.NoCredentialsError:
            raise RemoteAccessError(
                f"{where}: no AWS credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile)"
            ) from None
        except bx.ClientError as exc:
            raise _client_error(where, exc) from None
        except (bx.BotoCoreError, ConnectionError, TimeoutError) as exc:
            raise RemoteError(f"{where}: {type(exc).__name__}: {redact(one_line(exc))}") from None
        except Exception as exc:
            # boto3's transfer manager (upload_file) wraps the store's answer in its own Boto3Error
            # (S3UploadFailedError), which is neither of the above: map the error it wraps.
            from boto3.exceptions import Boto3Error

            if not isinstance(exc, Boto3Error):
                raise
            wrapped = exc.__cause__ or exc.__context__
            if isinstance(wrapped, bx.ClientError):
                raise _client_error(where, wrapped) from None
            raise RemoteError(f"{where}: {type(exc).__name__}: {redact(one_line(exc))}") from None

    # -- reads

    def head(self, name: str) -> int | None:
        """Size of object `name`, or None when it does not exist."""
        with self._errors(name):
            from botocore.exceptions import ClientError

            try:
                response = self.client.head_object(Bucket=self.remote.bucket, Key=self.remote.key(name))
            except ClientError as exc:
                if str(exc.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
                    return None
                raise
        return int(response["ContentLength"])

    def get_small(self, name: str, limit: int) -> tuple[bytes, str] | None:
        """(bytes, ETag) of a small object (LATEST, a manifest), or None when it does not exist. An object
        over `limit` bytes is refused (RefusedRemoteVersion naming it) without being read."""
        with self._errors(name):
            from botocore.exceptions import ClientError

            try:
                response = self.client.get_object(Bucket=self.remote.bucket, Key=self.remote.key(name))
            except ClientError as exc:
                if str(exc.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
                    return None
                raise
            body = response["Body"]
            try:
                size = int(response.get("ContentLength", 0))
                if size > limit:
                    raise RefusedRemoteVersion(
                        f"{self.remote.name_url(name)}: {size} bytes, more than the {limit} allowed"
                    )
                data = body.read(limit + 1)
            finally:
                body.close()
        if len(data) > limit:
            raise RefusedRemoteVersion(f"{self.remote.name_url(name)}: more than the {limit} bytes allowed")
        return data, str(response.get("ETag", ""))

    def stream_to(
        self, name: str, sink: BinaryIO | None, size: int, on_chunk: Callable[[int], None] | None = None
    ) -> str:
        """Stream object `name` (expected `size` bytes) into `sink` (None: just hash it) in STREAM_CHUNK
        pieces, never reading more than size + 1 bytes. Returns the sha256 hex of what was read.

        A missing object, or one whose length differs from `size` (announced or actually sent), raises
        RefusedRemoteVersion naming it; memory stays at one chunk whatever the object's size."""
        where = self.remote.name_url(name)
        digest = hashlib.sha256()
        with self._errors(name):
            from botocore.exceptions import ClientError

            try:
                response = self.client.get_object(Bucket=self.remote.bucket, Key=self.remote.key(name))
            except ClientError as exc:
                if str(exc.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
                    raise RefusedRemoteVersion(f"{where}: missing (listed in the manifest)") from None
                raise
            body = response["Body"]
            try:
                announced = int(response.get("ContentLength", -1))
                if announced != size:
                    raise RefusedRemoteVersion(f"{where}: {announced} bytes, the manifest says {size}")
                got = 0
                while True:
                    chunk = body.read(min(STREAM_CHUNK, size + 1 - got))
                    if not chunk:
                        break
                    got += len(chunk)
                    if got > size:
                        raise RefusedRemoteVersion(f"{where}: longer than the {size} bytes the manifest says")
                    digest.update(chunk)
                    if sink is not None:
                        sink.write(chunk)
                    if on_chunk is not None:
                        on_chunk(len(chunk))
                if got != size:
                    raise RefusedRemoteVersion(f"{where}: {got} bytes, the manifest says {size} (truncated)")
            finally:
                body.close()
        return digest.hexdigest()

    def list(self, under: str = "") -> list[RemoteObject]:
        """Every object under the remote OUT (or under its sub-prefix `under`, e.g. "v000003/"), names
        relative to the remote OUT (paginated; refused past MAX_LISTED_OBJECTS)."""
        found: list[RemoteObject] = []
        root = self.remote.key("")
        base = root + under
        with self._errors(""):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.remote.bucket, Prefix=base
            )
            for page in pages:
                for item in page.get("Contents", []):
                    found.append(
                        RemoteObject(item["Key"][len(root) :], int(item["Size"]), item["LastModified"])
                    )
                if len(found) > MAX_LISTED_OBJECTS:
                    raise RefusedRemoteVersion(
                        f"{self.remote.url}: more than {MAX_LISTED_OBJECTS} objects; not a remote OUT"
                    )
        return found

    def list_under(self, under: str) -> dict[str, RemoteObject]:
        """{name relative to `under`: object} for the objects under sub-prefix `under` (ends with "/")."""
        return {obj.name[len(under) :]: obj for obj in self.list(under)}

    # -- writes

    def put(self, name: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None) -> str:
        """Write a small object; returns its ETag. if_none_match: create only (PreconditionFailed when it
        exists); if_match: replace only while its ETag is still this one (PreconditionFailed otherwise)."""
        extra: dict[str, str] = {}
        if if_none_match:
            extra["IfNoneMatch"] = "*"
        if if_match is not None:
            extra["IfMatch"] = if_match
        with self._errors(name):
            response = self.client.put_object(
                Bucket=self.remote.bucket,
                Key=self.remote.key(name),
                Body=data,
                ChecksumAlgorithm="SHA256",
                **extra,
            )
        return str(response.get("ETag", ""))

    def upload_file(self, path: str, name: str, on_bytes: Callable[[int], None] | None = None) -> None:
        """Upload a local file (multipart above 64 MiB, parts in parallel, each part's SHA-256 sent for the
        store to check on receipt)."""
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(
            multipart_threshold=64 << 20, multipart_chunksize=64 << 20, max_concurrency=4, use_threads=True
        )
        with self._errors(name):
            self.client.upload_file(
                path,
                self.remote.bucket,
                self.remote.key(name),
                ExtraArgs={"ChecksumAlgorithm": "SHA256"},
                Config=config,
                Callback=on_bytes,
            )

    def delete(self, names: list[str]) -> None:
        """Delete objects (1000 per request); missing ones are fine."""
        for start in range(0, len(names), 1000):
            batch = names[start : start + 1000]
            with self._errors(batch[0]):
                response = self.client.delete_objects(
                    Bucket=self.remote.bucket,
                    Delete={"Objects": [{"Key": self.remote.key(n)} for n in batch], "Quiet": True},
                )
            errors = response.get("Errors") or []
            if errors:
                first = errors[0]
                raise RemoteError(
                    f"{self.remote.url}/{first.get('Key', '')}: could not delete ({first.get('Code', '')})"
                )


@dataclass
class RemoteVersions:
    """What one listing of a remote OUT shows: each version number's objects, and LATEST (name, ETag)."""

    objects: dict[int, dict[str, RemoteObject]]
    latest: str | None
    latest_etag: str | None
    oversized: list[str] = field(default_factory=list)

    def complete(self) -> list[int]:
        """Version numbers whose manifest.json exists (the manifest is uploaded last), ascending."""
        return sorted(n for n, objs in self.objects.items() if MANIFEST_NAME in objs)

    def latest_number(self) -> int | None:
        return parse_version_dir(self.latest) if self.latest else None


def read_latest(store: S3Store) -> tuple[str | None, str | None]:
    """(the version dir name remote LATEST holds, its ETag); (None, None) without a LATEST. A LATEST that
    is not UTF-8 text is returned as its repr so callers refuse it by name."""
    got = store.get_small(LATEST_NAME, 4096)
    if got is None:
        return None, None
    data, etag = got
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        text = repr(data[:40])
    return text or None, etag


def list_versions(store: S3Store) -> RemoteVersions:
    """One listing of the remote OUT grouped by version number (objects not under a vNNNNNN/ are
    ignored), and its LATEST."""
    by_version: dict[int, dict[str, RemoteObject]] = {}
    oversized: set[str] = set()
    for obj in store.list():
        head, _, rest = obj.name.partition("/")
        number = parse_version_dir(head)
        if number is not None and rest:
            by_version.setdefault(number, {})[rest] = obj
        elif oversized_version_dir(head):
            oversized.add(head)
    latest, etag = read_latest(store)
    return RemoteVersions(by_version, latest, etag, sorted(oversized))


def oversized_note(name: str) -> str:
    """What to say of a version-like name past MAX_VERSION."""
    return (
        f"{shown_version_dir(name)}: a version number past {MAX_VERSION} is not one zerogr writes (a stray "
        "or hostile object; delete it)"
    )
