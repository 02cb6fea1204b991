"""Composer's ``composer.utils.object_store``: the :class:`ObjectStore` interface, its
transient error, and Composer's provider classes at Composer's paths.

cadence reaches a provider through fsspec (:class:`cadence.utils.file_helpers.FsspecObjectStore`,
as its remote checkpoints do); the provider classes keep Composer 0.32.1's constructors:

- :class:`S3ObjectStore` (``s3_object_store``): S3 and S3-compatible stores through s3fs
  (the ``s3`` extra).
- :class:`SFTPObjectStore` (``sftp_object_store``): an SFTP server through fsspec's ``sftp``
  filesystem (paramiko, the ``sftp`` extra).
- :class:`LibcloudObjectStore` (``libcloud_object_store``): an Apache Libcloud storage driver
  (apache-libcloud, the ``libcloud`` extra).

Each raises :class:`~cadence.utils.import_helpers.MissingConditionalImportError` (naming the
extra) at construction when its package is not installed. The provider classes are imported
on first use (``from cadence.utils.object_store import S3ObjectStore``).

Source: Composer 0.32.1 ``composer/utils/object_store/__init__.py`` (the names).
"""

from __future__ import annotations

import importlib
from typing import Any

from cadence.utils.object_store.object_store import ObjectStore, ObjectStoreTransientError

__all__ = ["LibcloudObjectStore", "ObjectStore", "ObjectStoreTransientError", "S3ObjectStore",
           "SFTPObjectStore"]

_LAZY = {"S3ObjectStore": "s3_object_store", "SFTPObjectStore": "sftp_object_store",
         "LibcloudObjectStore": "libcloud_object_store"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(f"{__name__}.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
