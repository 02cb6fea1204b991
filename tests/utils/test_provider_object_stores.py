"""Composer's provider object stores at Composer's paths: ``S3ObjectStore`` over s3fs
(against the local moto server), ``SFTPObjectStore`` and ``LibcloudObjectStore`` raising
``MissingConditionalImportError`` naming their extra when their package is missing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.common.s3_server import s3_bucket, s3_folder  # noqa: F401


def test_provider_classes_are_importable_at_composers_paths() -> None:
    from cadence.utils import LibcloudObjectStore, S3ObjectStore, SFTPObjectStore
    from cadence.utils.object_store import ObjectStore
    from cadence.utils.object_store.libcloud_object_store import LibcloudObjectStore as L
    from cadence.utils.object_store.s3_object_store import S3ObjectStore as S
    from cadence.utils.object_store.sftp_object_store import SFTPObjectStore as F

    assert (LibcloudObjectStore, S3ObjectStore, SFTPObjectStore) == (L, S, F)
    assert all(issubclass(cls, ObjectStore) for cls in (L, S, F))


def test_s3_object_store_round_trip_under_a_prefix(s3_folder: str, tmp_path: Path) -> None:
    from cadence.utils.object_store import S3ObjectStore

    bucket, _, folder = s3_folder[len("s3://"):].partition("/")
    store = S3ObjectStore(bucket=bucket, prefix=f"/{folder}/")
    assert store.get_key("a/b.pt") == f"{folder}/a/b.pt"
    assert store.get_uri("a/b.pt") == f"s3://{bucket}/{folder}/a/b.pt"
    source = tmp_path / "src.bin"
    source.write_bytes(b"12345")
    sent: list[tuple[int, int]] = []
    store.upload_object("a/b.pt", source, callback=lambda n, total: sent.append((n, total)))
    assert sent == [(5, 5)]
    assert store.get_object_size("a/b.pt") == 5
    assert store.list_objects("a/") == ["a/b.pt"]
    store.download_object("a/b.pt", tmp_path / "out.bin")
    assert (tmp_path / "out.bin").read_bytes() == b"12345"
    with pytest.raises(FileExistsError):
        store.download_object("a/b.pt", tmp_path / "out.bin")
    with pytest.raises(FileNotFoundError):
        store.get_object_size("missing.pt")
    # the same object through a store of the whole bucket (explicit endpoint and credentials)
    import os
    whole = S3ObjectStore(bucket, endpoint_url=os.environ["AWS_ENDPOINT_URL"],
                          aws_access_key_id="testing", aws_secret_access_key="testing",
                          region_name="us-east-1")
    assert whole.get_object_size(f"{folder}/a/b.pt") == 5


@pytest.mark.skipif(importlib.util.find_spec("paramiko") is not None,
                    reason="paramiko is installed")
def test_sftp_store_without_paramiko_names_the_extra() -> None:
    from cadence.utils import MissingConditionalImportError, SFTPObjectStore

    with pytest.raises(MissingConditionalImportError, match=r"cadence\[sftp\]"):
        SFTPObjectStore(host="sftp://user@example.com:2222/./data")


@pytest.mark.skipif(importlib.util.find_spec("libcloud") is not None,
                    reason="apache-libcloud is installed")
def test_libcloud_store_without_libcloud_names_the_extra() -> None:
    from cadence.utils import LibcloudObjectStore, MissingConditionalImportError

    with pytest.raises(MissingConditionalImportError, match=r"cadence\[libcloud\]"):
        LibcloudObjectStore(provider="s3", container="bucket",
                            provider_kwargs={"key": "k", "secret": "s"})


def test_sftp_uri_parsing_as_composer() -> None:
    from cadence.utils.object_store.sftp_object_store import _uri_parts

    assert _uri_parts("sftp://me:pw@host:2222/./rel", 22, None, None, "") == (
        "host", 2222, "me", "pw", "./rel")
    assert _uri_parts("sftp://host//abs/dir", 22, None, None, "") == (
        "host", 22, None, None, "/abs/dir")
    assert _uri_parts("plainhost", 22, "u", None, "c") == ("plainhost", 22, "u", None, "c")
    with pytest.raises(ValueError, match="only the sftp scheme"):
        _uri_parts("ftp://host", 22, None, None, "")
    with pytest.raises(ValueError, match="username"):
        _uri_parts("sftp://me@host", 22, "other", None, "")
