"""Composer's file and object-store helpers (``cadence.utils``): on local paths, ``file://``
and s3 (moto's local server), as llm-foundry calls them."""

from __future__ import annotations

import datetime
import warnings
from pathlib import Path

import pytest

from cadence.core.time import Timestamp
from cadence.loggers import RemoteUploaderDownloader
from cadence.utils import (
    ObjectStore, format_name_with_dist_and_time, get_file, maybe_create_object_store_from_uri,
    maybe_create_remote_uploader_downloader_from_uri, parse_uri,
)
from cadence.utils.file_helpers import FsspecObjectStore, list_remote_objects
from tests.common.s3_server import s3_bucket, s3_folder  # noqa: F401


@pytest.mark.parametrize("uri, parsed", [
    ("s3://bucket/a/b.pt", ("s3", "bucket", "a/b.pt")),
    ("gs://b/x", ("gs", "b", "x")),
    ("oci://user@bucket/p", ("oci", "user", "p")),
    ("AZURE_BLOBS://container/p", ("azure", "container", "p")),
    ("/local/path/x.pt", ("", "", "/local/path/x.pt")),
    ("relative/x.pt", ("", "", "relative/x.pt")),
    (Path("/p/q"), ("", "", "/p/q")),
])
def test_parse_uri_as_composer(uri: object, parsed: tuple[str, str, str]) -> None:
    assert parse_uri(uri) == parsed  # type: ignore[arg-type]


def test_local_path_makes_no_store_and_unsupported_backends_are_refused() -> None:
    assert maybe_create_object_store_from_uri("/tmp/x") is None
    with pytest.raises(NotImplementedError, match="WandBLogger"):
        maybe_create_object_store_from_uri("wandb://project/x")
    with pytest.raises(NotImplementedError, match="dbfs"):
        maybe_create_object_store_from_uri("dbfs:/Volumes/a/b")
    with pytest.raises(ValueError, match="nosuchproto"):
        maybe_create_object_store_from_uri("nosuchproto://bucket/x")


def test_get_file_local_symlinks_and_follows_symlink_files(tmp_path: Path) -> None:
    src = tmp_path / "real.txt"
    src.write_text("hello")
    dest = tmp_path / "dest.txt"
    get_file(str(src), str(dest))
    assert dest.is_symlink() and dest.read_text() == "hello"
    with pytest.raises(FileExistsError):
        get_file(str(src), str(dest))
    get_file(str(src), str(dest), overwrite=True)
    # Composer's .symlink text file: <name>.symlink holds the real object's name
    (tmp_path / "alias.txt.symlink").write_text(str(src))
    get_file(str(tmp_path / "alias.txt"), str(tmp_path / "via_alias.txt"))
    assert (tmp_path / "via_alias.txt").read_text() == "hello"
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        get_file(str(tmp_path / "missing.txt"), str(tmp_path / "never.txt"))


def test_fsspec_store_on_a_file_url(tmp_path: Path) -> None:
    store = maybe_create_object_store_from_uri(f"file://{tmp_path}/x")
    assert isinstance(store, ObjectStore)
    src = tmp_path / "w.bin"
    src.write_bytes(b"12345")
    local = FsspecObjectStore(str(tmp_path / "bucket"))
    local.upload_object("a/w.bin", src)
    assert local.get_object_size("a/w.bin") == 5
    assert local.list_objects("a/") == ["a/w.bin"]
    local.download_object("a/w.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == b"12345"
    with pytest.raises(FileNotFoundError):
        local.get_object_size("nope")


def test_object_store_get_file_and_list_on_s3(s3_folder: str, tmp_path: Path) -> None:
    backend, bucket, prefix = parse_uri(s3_folder)
    store = maybe_create_object_store_from_uri(s3_folder)
    assert isinstance(store, FsspecObjectStore) and store.get_uri("k") == f"s3://{bucket}/k"
    src = tmp_path / "weights.pt"
    src.write_bytes(b"\x00" * 100)
    sizes = []
    store.upload_object(f"{prefix}/ckpt/weights.pt", src, callback=lambda n, t: sizes.append(t))
    assert sizes == [100]
    assert store.get_object_size(f"{prefix}/ckpt/weights.pt") == 100
    assert list_remote_objects(f"{s3_folder}/ckpt") == [f"{prefix}/ckpt/weights.pt"]
    get_file(f"{s3_folder}/ckpt/weights.pt", str(tmp_path / "down.pt"))
    assert (tmp_path / "down.pt").read_bytes() == b"\x00" * 100
    with pytest.raises(FileExistsError):
        store.download_object(f"{prefix}/ckpt/weights.pt", tmp_path / "down.pt")
    with pytest.raises(FileNotFoundError):
        get_file(f"{s3_folder}/ckpt/absent.pt", str(tmp_path / "absent.pt"))
    with pytest.raises(ValueError, match="local path"):
        list_remote_objects(str(tmp_path))


def test_format_name_with_dist_and_time_fills_known_fields_only() -> None:
    ts = Timestamp(epoch=2, batch=30, sample=120, token=4800,
                   total_wct=datetime.timedelta(seconds=1.5))
    name = format_name_with_dist_and_time(
        "{run_name}/ep{epoch}-ba{batch}-rank{rank}-{sample}-{token}.{extension}-{unknown}",
        run_name="run", timestamp=ts, extension="json")
    assert name == "run/ep2-ba30-rank0-120-4800.json-{unknown}"


def test_remote_uploader_downloader_from_uri(s3_bucket: str) -> None:
    assert maybe_create_remote_uploader_downloader_from_uri("/local/dir", []) is None
    made = maybe_create_remote_uploader_downloader_from_uri(f"{s3_bucket}/runs/x", [])
    assert isinstance(made, RemoteUploaderDownloader) and made.bucket_uri == s3_bucket
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = maybe_create_remote_uploader_downloader_from_uri(f"{s3_bucket}/other", [made])
    assert again is None and "already exists" in str(caught[0].message)
    with pytest.raises(NotImplementedError, match="WandBLogger"):
        maybe_create_remote_uploader_downloader_from_uri("wandb://p/x", [])
