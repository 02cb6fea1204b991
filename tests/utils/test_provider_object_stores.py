"""Composer's provider object stores at Composer's paths: ``S3ObjectStore`` over s3fs
(against the local moto server), ``LibcloudObjectStore`` over Libcloud's ``local`` driver (a
folder), and ``SFTPObjectStore`` and ``LibcloudObjectStore`` raising
``MissingConditionalImportError`` naming their extra when their package is missing."""

from __future__ import annotations

import sys
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


def test_sftp_store_without_paramiko_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from cadence.utils import MissingConditionalImportError, SFTPObjectStore

    monkeypatch.setitem(sys.modules, "paramiko", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "fsspec.implementations.sftp", None)

    with pytest.raises(MissingConditionalImportError, match=r"cadence\[sftp\]"):
        SFTPObjectStore(host="sftp://user@example.com:2222/./data")


def test_libcloud_store_without_libcloud_names_the_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from cadence.utils import LibcloudObjectStore, MissingConditionalImportError

    for name in [m for m in sys.modules if m == "libcloud" or m.startswith("libcloud.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "libcloud", None)  # as if not installed

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


def test_libcloud_store_round_trip_in_a_local_container(tmp_path: Path) -> None:
    pytest.importorskip("libcloud")
    from cadence.utils import LibcloudObjectStore

    (tmp_path / "root" / "bucket").mkdir(parents=True)
    store = LibcloudObjectStore(provider="local", container="bucket",
                                provider_kwargs={"key": str(tmp_path / "root")})
    assert store.get_uri("ck/ep1.pt") == "local://bucket/ck/ep1.pt"
    source = tmp_path / "src.bin"
    source.write_bytes(b"x" * 3000)
    sent: list[tuple[int, int]] = []
    store.upload_object("ck/ep1.pt", source, callback=lambda n, total: sent.append((n, total)))
    assert sent == [(3000, 3000)]
    assert (tmp_path / "root" / "bucket" / "ck" / "ep1.pt").read_bytes() == b"x" * 3000
    assert store.get_object_size("ck/ep1.pt") == 3000
    assert store.list_objects("ck/") == ["ck/ep1.pt"] and store.list_objects("zz") == []
    small = LibcloudObjectStore(provider="local", container="bucket", chunk_size=1024,
                                provider_kwargs={"key": str(tmp_path / "root")})
    small.download_object("ck/ep1.pt", tmp_path / "out" / "ep1.pt")  # 3 chunks
    assert (tmp_path / "out" / "ep1.pt").read_bytes() == b"x" * 3000
    with pytest.raises(FileExistsError):
        store.download_object("ck/ep1.pt", tmp_path / "out" / "ep1.pt")
    store.download_object("ck/ep1.pt", tmp_path / "out" / "ep1.pt", overwrite=True)
    with pytest.raises(FileNotFoundError, match="local://bucket/missing.pt"):
        store.get_object_size("missing.pt")
    assert not list((tmp_path / "out").glob("*.tmp"))
