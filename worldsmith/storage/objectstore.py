"""Content-addressed object store: artifacts are stored by sha256, never overwritten, verified on read.

Two backends behind one interface, chosen by URL (`WORLDSMITH_STORE_URL`):
- a local directory (`file:///path` or a plain path; the default is `$WORLDSMITH_HOME/store`);
- `s3://bucket/prefix` through boto3, with any endpoint (AWS, MinIO, R2, Ceph).
Objects live at `<prefix>/sha256/<2 hex>/<64 hex>`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

from worldsmith.errors import WorldsmithError
from worldsmith.failures import UserFixable

CHUNK = 1 << 20
DIGEST_PREFIX = "sha256:"


class ObjectMissing(WorldsmithError, KeyError):
    """No object with that digest in the store."""


class StoreUnavailable(UserFixable):
    """The configured object store cannot be used (no credentials, an endpoint that does not answer, a
    missing bucket, access denied); the message is one line naming the setting to fix. `exit_code` 1."""

    exit_code = 1


_MISSING_CODES = ("404", "NoSuchKey", "NotFound")


class ObjectCorrupted(WorldsmithError, ValueError):
    """An object's content does not match its digest."""


def digest_of(data: bytes) -> str:
    return DIGEST_PREFIX + hashlib.sha256(data).hexdigest()


def _hex(digest: str) -> str:
    value = digest.removeprefix(DIGEST_PREFIX)
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ValueError(f"not a sha256 digest: {digest!r}")
    return value


def object_key(digest: str) -> str:
    value = _hex(digest)
    return f"sha256/{value[:2]}/{value}"


def _hash_file(path: Path) -> tuple[str, int]:
    sha = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return DIGEST_PREFIX + sha.hexdigest(), size


class ObjectStore(ABC):
    """Put and get immutable objects by sha256 digest (`sha256:<hex>`)."""

    url: str

    @abstractmethod
    def exists(self, digest: str) -> bool: ...

    @abstractmethod
    def _write(self, digest: str, source: Path, size: int) -> None:
        """Store file `source` (already hashed to `digest`) unless present."""

    @abstractmethod
    def _open(self, digest: str) -> IO[bytes]:
        """A binary stream of the stored object; raises ObjectMissing."""

    def put_bytes(self, data: bytes) -> str:
        """Store `data`; returns its digest. Storing existing content writes nothing."""
        digest = digest_of(data)
        if not self.exists(digest):
            with tempfile.NamedTemporaryFile(delete=False) as tmp:
                tmp.write(data)
            try:
                self._write(digest, Path(tmp.name), len(data))
            finally:
                os.unlink(tmp.name)
        return digest

    def put_file(self, path: Path) -> str:
        """Store a file by streaming it (large files go up in parts); returns its digest."""
        digest, size = _hash_file(path)
        if not self.exists(digest):
            self._write(digest, path, size)
        return digest

    def get_bytes(self, digest: str) -> bytes:
        """The object's content, verified against its digest."""
        with self._open(digest) as stream:
            data = stream.read()
        if digest_of(data) != digest:
            raise ObjectCorrupted(
                f"object {digest} is corrupted in {self.url}: its content hashes to {digest_of(data)}"
            )
        return data

    def get_file(self, digest: str, target: Path) -> Path:
        """Stream the object into `target`, verifying the digest before the file appears."""
        target.parent.mkdir(parents=True, exist_ok=True)
        sha = hashlib.sha256()
        with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp, self._open(digest) as stream:
            while chunk := stream.read(CHUNK):
                sha.update(chunk)
                tmp.write(chunk)
        if DIGEST_PREFIX + sha.hexdigest() != digest:
            os.unlink(tmp.name)
            raise ObjectCorrupted(
                f"object {digest} is corrupted in {self.url}: its content hashes to sha256:{sha.hexdigest()}"
            )
        os.replace(tmp.name, target)
        return target


class LocalStore(ObjectStore):
    """Objects as files under a directory; written to a temp file and linked into place atomically."""

    def __init__(self, root: Path):
        self.root = root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = self.root.as_uri()

    def _path(self, digest: str) -> Path:
        return self.root / object_key(digest)

    def exists(self, digest: str) -> bool:
        return self._path(digest).is_file()

    def _write(self, digest: str, source: Path, size: int) -> None:
        target = self._path(digest)
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp:
            with source.open("rb") as f:
                shutil.copyfileobj(f, tmp, CHUNK)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.chmod(tmp.name, 0o444)
        try:
            os.link(tmp.name, target)  # fails if present: never overwrite
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp.name)

    def _open(self, digest: str) -> IO[bytes]:
        try:
            return self._path(digest).open("rb")
        except FileNotFoundError:
            raise ObjectMissing(f"no object {digest} in {self.url}") from None


class S3Store(ObjectStore):
    """Objects in an S3 bucket under a prefix, through boto3 (multipart above `multipart_mb`)."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        client: Any = None,
        endpoint_url: str | None = None,
        multipart_mb: int = 8,
    ):
        import boto3
        from boto3.s3.transfer import TransferConfig

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client or boto3.client("s3", endpoint_url=endpoint_url)
        self.transfer = TransferConfig(multipart_threshold=multipart_mb << 20, multipart_chunksize=multipart_mb << 20)
        self.url = f"s3://{bucket}/{self.prefix}".rstrip("/")

    def _key(self, digest: str) -> str:
        return f"{self.prefix}/{object_key(digest)}" if self.prefix else object_key(digest)

    @contextmanager
    def _answering(self, digest: str) -> Iterator[None]:
        """An absent object as ObjectMissing; failures of the store itself as StoreUnavailable naming the fix."""
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

        endpoint = self.client.meta.endpoint_url
        try:
            yield
        except NoCredentialsError:
            raise StoreUnavailable(
                f"no credentials for the object store {self.url}: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
            ) from None
        except EndpointConnectionError:
            raise StoreUnavailable(
                f"the object store endpoint {endpoint} does not answer: check that it runs and "
                "WORLDSMITH_S3_ENDPOINT_URL"
            ) from None
        except (ClientError, S3UploadFailedError) as exc:
            code = exc.response.get("Error", {}).get("Code", "") if isinstance(exc, ClientError) else ""
            if code in _MISSING_CODES:
                raise ObjectMissing(f"no object {digest} in {self.url}") from None
            reason = str(exc).strip().splitlines()[0]
            raise StoreUnavailable(
                f"the object store {self.url} ({endpoint}) refused: {reason}; check the bucket, the "
                "credentials and WORLDSMITH_STORE_URL"
            ) from None

    def exists(self, digest: str) -> bool:
        try:
            with self._answering(digest):
                self.client.head_object(Bucket=self.bucket, Key=self._key(digest))
            return True
        except ObjectMissing:
            return False

    def _write(self, digest: str, source: Path, size: int) -> None:
        with source.open("rb") as f, self._answering(digest):
            self.client.upload_fileobj(
                f,
                self.bucket,
                self._key(digest),
                Config=self.transfer,
                ExtraArgs={"Metadata": {"sha256": _hex(digest)}},
            )

    def _open(self, digest: str) -> IO[bytes]:
        with self._answering(digest):
            body: IO[bytes] = self.client.get_object(Bucket=self.bucket, Key=self._key(digest))["Body"]
            return body


def open_store(url: str, *, endpoint_url: str | None = None) -> ObjectStore:
    """The store at `url`: `s3://bucket/prefix`, `file:///path` or a plain directory path."""
    parsed = urlparse(url)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"store URL {url!r} names no bucket")
        return S3Store(parsed.netloc, parsed.path, endpoint_url=endpoint_url)
    if parsed.scheme in ("file", ""):
        return LocalStore(Path(parsed.path if parsed.scheme == "file" else url))
    raise ValueError(f"unsupported store URL {url!r}: use a directory, file:///path or s3://bucket/prefix")


def configured_store() -> ObjectStore:
    """The store the settings name (`WORLDSMITH_STORE_URL`, `WORLDSMITH_S3_ENDPOINT_URL`)."""
    from worldsmith.settings import get_settings

    settings = get_settings()
    return open_store(settings.resolved_store_url(), endpoint_url=settings.s3_endpoint_url)
