"""Composer's ``composer.utils.object_store``: the :class:`ObjectStore` interface, its
transient error, and :class:`FsspecObjectStore`, the one implementation, over any fsspec
filesystem (``s3://``, ``gs://``, ``file://``, ...).

Composer ships one class per provider (``S3ObjectStore``, ``GCSObjectStore``, ...) over each
provider's SDK; cadence reaches every provider through fsspec, as its remote checkpoints do
(:func:`cadence.checkpoint.remote.get_filesystem`: the extra to install is named when a
protocol's package is missing, credentials come from the environment only).

Source: Composer 0.32.1 ``composer/utils/object_store/object_store.py`` (the methods, their
arguments and errors).
"""

from __future__ import annotations

import abc
import os
import pathlib
from types import TracebackType
from typing import Any, Callable, Optional, Union

from cadence.checkpoint.remote import get_filesystem, is_remote, local_path

__all__ = ["FsspecObjectStore", "ObjectStore", "ObjectStoreTransientError"]


class ObjectStoreTransientError(RuntimeError):
    """A transient failure (too many requests, temporarily unavailable): worth retrying, e.g.
    with :func:`cadence.utils.retry` (``@retry(ObjectStoreTransientError)``)."""


class ObjectStore(abc.ABC):
    """An object store: named objects that can be uploaded, downloaded, sized and listed.

    Subclasses override the methods they support; the others raise
    :class:`NotImplementedError`. A store is a context manager (``close()`` on exit).
    """

    def get_uri(self, object_name: str) -> str:
        """The URI of ``object_name`` (computed; the object need not exist)."""
        raise NotImplementedError(f"{type(self).__name__}.get_uri is not implemented")

    def upload_object(self, object_name: str, filename: Union[str, pathlib.Path],
                      callback: Optional[Callable[[int, int], None]] = None,
                      **kwargs: Any) -> None:
        """Upload the local file ``filename`` as ``object_name``; ``callback(bytes_sent,
        total_bytes)`` when given.

        Raises:
            ObjectStoreTransientError: a transient failure.
        """
        del object_name, filename, callback, kwargs
        raise NotImplementedError(f"{type(self).__name__}.upload_object is not implemented")

    def get_object_size(self, object_name: str) -> int:
        """The size of ``object_name`` in bytes.

        Raises:
            FileNotFoundError: there is no such object.
        """
        raise NotImplementedError(f"{type(self).__name__}.get_object_size is not implemented")

    def download_object(self, object_name: str, filename: Union[str, pathlib.Path],
                        overwrite: bool = False,
                        callback: Optional[Callable[[int, int], None]] = None) -> None:
        """Download ``object_name`` to the local file ``filename``.

        Raises:
            FileExistsError: ``filename`` exists and ``overwrite`` is False.
            FileNotFoundError: there is no such object.
        """
        del object_name, filename, overwrite, callback
        raise NotImplementedError(f"{type(self).__name__}.download_object is not implemented")

    def list_objects(self, prefix: Optional[str]) -> list[str]:
        """The names of the objects whose names start with ``prefix`` (all when None)."""
        del prefix
        raise NotImplementedError(f"{type(self).__name__}.list_objects is not implemented")

    def close(self) -> None:
        """Release the store's resources (nothing by default)."""

    def __enter__(self) -> ObjectStore:
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 traceback: Optional[TracebackType]) -> None:
        self.close()


class FsspecObjectStore(ObjectStore):
    """Objects under the fsspec URL ``root`` (``s3://bucket``, ``gs://bucket/prefix``,
    ``file:///abs/dir`` or a plain local folder): object ``a/b.pt`` is ``<root>/a/b.pt``.

    Args:
        root: the URL (or local folder) that object names are relative to.

    Raises:
        ValueError: the protocol is unknown or its fsspec package is not installed (the
            message names the extra), or the URL carries credentials.
    """

    def __init__(self, root: str) -> None:
        self.root = str(root).rstrip("/")
        self._fs, path = get_filesystem(self.root or ".")
        self._remote = is_remote(self.root)
        self._path = path if self._remote else os.path.abspath(local_path(self.root or "."))

    def _key(self, object_name: str) -> str:
        if not self._remote:
            return os.path.join(self._path, object_name.lstrip("/"))
        return f"{self._path}/{object_name.lstrip('/')}" if self._path else object_name

    def get_uri(self, object_name: str) -> str:
        return f"{self.root}/{object_name.lstrip('/')}"

    def upload_object(self, object_name: str, filename: Union[str, pathlib.Path],
                      callback: Optional[Callable[[int, int], None]] = None,
                      **kwargs: Any) -> None:
        size = os.path.getsize(filename)
        key = self._key(object_name)
        parent = key.rpartition("/")[0]
        if parent and not self._remote:
            self._fs.makedirs(parent, exist_ok=True)
        self._fs.put_file(os.fspath(filename), key, **kwargs)
        if callback is not None:
            callback(size, size)

    def get_object_size(self, object_name: str) -> int:
        info = self._fs.info(self._key(object_name))  # FileNotFoundError when missing
        if info.get("type") == "directory":
            raise FileNotFoundError(f"{self.get_uri(object_name)} is a folder, not an object.")
        return int(info["size"])

    def download_object(self, object_name: str, filename: Union[str, pathlib.Path],
                        overwrite: bool = False,
                        callback: Optional[Callable[[int, int], None]] = None) -> None:
        filename = os.fspath(filename)
        if os.path.exists(filename) and not overwrite:
            raise FileExistsError(f"{filename} exists; pass overwrite=True to replace it.")
        size = self.get_object_size(object_name)  # FileNotFoundError first, before a file
        os.makedirs(os.path.dirname(os.path.abspath(filename)), exist_ok=True)
        tmp = f"{filename}.{os.getpid()}.tmp"
        try:
            self._fs.get_file(self._key(object_name), tmp)
            os.replace(tmp, filename)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        if callback is not None:
            callback(size, size)

    def list_objects(self, prefix: Optional[str] = None) -> list[str]:
        self._fs.invalidate_cache()
        base = self._path.rstrip("/") if self._remote else self._path
        found = self._fs.find(base)
        names = sorted(key[len(base):].lstrip("/") for key in found)
        return [n for n in names if n.startswith(prefix or "")]
