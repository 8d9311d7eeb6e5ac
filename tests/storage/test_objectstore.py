"""The object store on a local directory and on S3 (moto's server over HTTP, real boto3)."""

from __future__ import annotations

import os
from pathlib import Path

import boto3
import pytest

from worldsmith.storage.objectstore import (
    LocalStore,
    ObjectCorrupted,
    ObjectMissing,
    S3Store,
    digest_of,
    object_key,
    open_store,
)

pytestmark = pytest.mark.unit


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    bucket = request.getfixturevalue("s3_bucket")
    return S3Store(bucket, "team/worlds", endpoint_url=request.getfixturevalue("s3_endpoint"), multipart_mb=5)


def test_put_get_by_digest(store):
    digest = store.put_bytes(b"hello world")
    assert digest == digest_of(b"hello world")
    assert store.exists(digest)
    assert store.get_bytes(digest) == b"hello world"
    assert not store.exists(digest_of(b"other"))
    with pytest.raises(ObjectMissing):
        store.get_bytes(digest_of(b"other"))


def test_same_content_twice_writes_nothing(store, tmp_path):
    first = store.put_bytes(b"x" * 1000)
    if isinstance(store, LocalStore):
        path = store.root / object_key(first)
        before = path.stat().st_mtime_ns, path.stat().st_ino
        assert store.put_bytes(b"x" * 1000) == first
        assert (path.stat().st_mtime_ns, path.stat().st_ino) == before
        assert not os.access(path, os.W_OK) or os.geteuid() == 0  # read-only file
    else:
        head = store.client.head_object(Bucket=store.bucket, Key=store._key(first))
        assert store.put_bytes(b"x" * 1000) == first
        again = store.client.head_object(Bucket=store.bucket, Key=store._key(first))
        assert again["LastModified"] == head["LastModified"] and again["ETag"] == head["ETag"]


def test_large_object_streams_in_parts(store, tmp_path):
    big = tmp_path / "big.bin"
    with big.open("wb") as f:
        for _ in range(12):
            f.write(os.urandom(1 << 20))
    digest = store.put_file(big)
    out = store.get_file(digest, tmp_path / "out" / "big.bin")
    assert out.read_bytes() == big.read_bytes()
    if isinstance(store, S3Store):
        head = store.client.head_object(Bucket=store.bucket, Key=store._key(digest))
        assert "-" in head["ETag"]  # multipart ETags are "<md5>-<parts>"


def test_corrupted_object_is_detected_on_read(store, tmp_path):
    digest = store.put_bytes(b"precious bytes")
    if isinstance(store, LocalStore):
        path = store.root / object_key(digest)
        os.chmod(path, 0o644)
        path.write_bytes(b"tampered bytes")
    else:
        store.client.put_object(Bucket=store.bucket, Key=store._key(digest), Body=b"tampered bytes")
    with pytest.raises(ObjectCorrupted, match="corrupted"):
        store.get_bytes(digest)
    with pytest.raises(ObjectCorrupted):
        store.get_file(digest, tmp_path / "copy")
    assert not (tmp_path / "copy").exists()


@pytest.mark.sandbox
def test_open_store_urls(tmp_path, s3_endpoint, s3_bucket):
    assert isinstance(open_store(str(tmp_path / "a")), LocalStore)
    assert isinstance(open_store((tmp_path / "b").as_uri()), LocalStore)
    s3 = open_store(f"s3://{s3_bucket}/p", endpoint_url=s3_endpoint)
    assert isinstance(s3, S3Store) and s3.prefix == "p"
    digest = s3.put_bytes(b"via url")
    keys = [
        o["Key"] for o in boto3.client("s3", endpoint_url=s3_endpoint).list_objects_v2(Bucket=s3_bucket)["Contents"]
    ]
    assert keys == [f"p/{object_key(digest)}"]
    with pytest.raises(ValueError, match="unsupported store URL"):
        open_store("ftp://x/y")


@pytest.mark.sandbox
def test_a_store_that_cannot_be_used_is_one_line_naming_the_fix(s3_endpoint, s3_bucket, tmp_path, monkeypatch):
    """A missing bucket, an endpoint that does not answer and absent credentials are StoreUnavailable
    (a one-line UserFixable, exit 1), while a missing object stays ObjectMissing."""
    from worldsmith.failures import UserFixable
    from worldsmith.localserver import free_port
    from worldsmith.storage.objectstore import StoreUnavailable

    with pytest.raises(StoreUnavailable, match="check the bucket") as missing_bucket:
        S3Store("no-such-bucket", endpoint_url=s3_endpoint).put_bytes(b"x")
    assert isinstance(missing_bucket.value, UserFixable) and missing_bucket.value.exit_code == 1
    with pytest.raises(ObjectMissing):
        S3Store(s3_bucket, endpoint_url=s3_endpoint).get_bytes(digest_of(b"never stored"))
    from botocore.config import Config

    client = boto3.client(
        "s3", endpoint_url=f"http://127.0.0.1:{free_port()}", config=Config(retries={"max_attempts": 1})
    )
    with pytest.raises(StoreUnavailable, match="WORLDSMITH_S3_ENDPOINT_URL") as down:
        S3Store(s3_bucket, client=client).exists(digest_of(b"x"))
    assert "\n" not in str(down.value)
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    fresh = boto3.session.Session()  # boto3's default session keeps the credentials it found earlier
    with pytest.raises(StoreUnavailable, match="AWS_ACCESS_KEY_ID"):
        S3Store(s3_bucket, client=fresh.client("s3", endpoint_url=s3_endpoint)).put_bytes(b"x")
