"""Composer's ``composer.utils.object_store``: the :class:`ObjectStore` interface, its
transient error, and the local half of every store's ``download_object`` (refuse an existing
file, write a temporary sibling, rename it into place).

The general implementation is :class:`cadence.utils.file_helpers.FsspecObjectStore`, over any
fsspec filesystem (``s3://``, ``gs://``, ``file://``, ...), as cadence's remote checkpoints
use (:func:`cadence.checkpoint.remote.get_filesystem`: the extra to install is named when a
protocol's package is missing, credentials come from the environment only). Composer's
provider classes are in this package too: ``S3ObjectStore`` and ``SFTPObjectStore`` over
fsspec, ``LibcloudObjectStore`` over Apache Libcloud.

Source: Composer 0.32.1 ``composer/utils/object_store/object_store.py`` (the methods, their
arguments and errors).
"""

from __future__ import annotations

import abc
import contextlib
import os
import pathlib
from types import TracebackType
from typing import Any, Callable, Iterator, Optional, Union

__all__ = ["ObjectStore", "ObjectStoreTransientError"]


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


def refuse_existing(filename: Union[str, pathlib.Path], overwrite: bool) -> str:
    """``filename`` as a ``str``, for a download into it.

    Raises:
        FileExistsError: ``filename`` exists and ``overwrite`` is False.
    """
    filename = os.fspath(filename)
    if os.path.exists(filename) and not overwrite:
        raise FileExistsError(f"{filename} exists; pass overwrite=True to replace it.")
    return filename


@contextlib.contextmanager
def staged_download(filename: str) -> Iterator[str]:
    """A temporary path beside ``filename`` (its folder created) to download into: renamed
    to ``filename`` when the block ends without an error, removed in any case, so
    ``filename`` is either the whole object or untouched."""
    os.makedirs(os.path.dirname(os.path.abspath(filename)), exist_ok=True)
    tmp = f"{filename}.{os.getpid()}.tmp"
    try:
        yield tmp
        os.replace(tmp, filename)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
