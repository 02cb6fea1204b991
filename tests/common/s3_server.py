"""A local S3-compatible server for tests: moto's ``ThreadedMotoServer`` on 127.0.0.1 (a free
port), with s3fs pointed at it through ``AWS_ENDPOINT_URL``; no request leaves the machine.

Fixtures (import them into a test module, or a conftest)::

    from tests.common.s3_server import s3_bucket, s3_folder  # noqa: F401

- ``s3_bucket`` (session): starts the server, sets ``AWS_ENDPOINT_URL``,
  ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and ``AWS_DEFAULT_REGION`` in
  ``os.environ`` (so subprocesses and spawned ranks inherit them), creates a bucket and
  yields its URL, ``s3://cadence-test``.
- ``s3_folder`` (function): a fresh prefix in that bucket for one test,
  ``s3://cadence-test/<test>-<random>``; the test's stage folder (``XDG_CACHE_HOME``) is
  under its ``tmp_path``, and s3fs's instance and listing caches are cleared first.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.common.distributed import find_free_port

__all__ = ["BUCKET", "s3_bucket", "s3_folder", "s3_ls"]

BUCKET = "cadence-test"


def _clear_s3fs_caches() -> None:
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="session")
def s3_bucket() -> Iterator[str]:
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    port = find_free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        patch.delenv("AWS_PROFILE", raising=False)
        _clear_s3fs_caches()
        import s3fs

        s3fs.S3FileSystem().makedirs(BUCKET, exist_ok=True)  # moto keeps one backend per process
        try:
            yield f"s3://{BUCKET}"
        finally:
            _clear_s3fs_caches()
            server.stop()


@pytest.fixture
def s3_folder(s3_bucket: str, tmp_path: Path, monkeypatch: Any,
              request: pytest.FixtureRequest) -> str:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    _clear_s3fs_caches()
    name = request.node.name.replace("[", "-").replace("]", "")[:40]
    return f"{s3_bucket}/{name}-{secrets.token_hex(3)}"


def s3_ls(url: str) -> list[str]:
    """Object names directly under ``url`` (fresh listing)."""
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    root = url.split("://", 1)[1]
    try:
        keys = fs.ls(root, detail=False)
    except FileNotFoundError:  # an empty prefix does not exist in S3
        return []
    return sorted(key.rsplit("/", 1)[-1] for key in keys)

