"""Composer's ``LibcloudObjectStore``: a container of an Apache Libcloud storage provider.

Source: Composer 0.32.1 ``composer/utils/object_store/libcloud_object_store.py`` (the
constructor's arguments and defaults, the ``key_environ``/``secret_environ`` rule, the
``<provider>://<container>/<object>`` URIs).
"""

from __future__ import annotations

import os
import pathlib
from typing import Any, Callable, Optional, Union

from cadence.utils.import_helpers import MissingConditionalImportError
from cadence.utils.object_store.object_store import (
    ObjectStore, refuse_existing, staged_download,
)

__all__ = ["LibcloudObjectStore"]


class LibcloudObjectStore(ObjectStore):
    """The objects of container ``container`` of Libcloud provider ``provider``.

    Args:
        provider: the Libcloud provider name (``'s3'``, ``'google_storage'``, ``'local'``...).
        container: the container (bucket) name.
        chunk_size: bytes per chunk when streaming a download. Default 1 MiB.
        key_environ: an environment variable holding the provider's ``key``, used when
            ``provider_kwargs`` has none. Default None.
        secret_environ: likewise for ``secret``. Default None.
        provider_kwargs: the provider driver's constructor arguments. Default None.

    Raises:
        MissingConditionalImportError: apache-libcloud is not installed
            (``pip install 'cadence[libcloud]'``).
    """

    def __init__(self, provider: str, container: str, chunk_size: int = 1_024 * 1_024,
                 key_environ: Optional[str] = None, secret_environ: Optional[str] = None,
                 provider_kwargs: Optional[dict[str, Any]] = None) -> None:
        try:
            from libcloud.storage.providers import get_driver
        except ImportError as exc:
            raise MissingConditionalImportError("libcloud", "apache-libcloud") from exc
        provider_kwargs = dict(provider_kwargs or {})
        if "key" not in provider_kwargs and key_environ and key_environ in os.environ:
            provider_kwargs["key"] = os.environ[key_environ]
        if "secret" not in provider_kwargs and secret_environ and secret_environ in os.environ:
            provider_kwargs["secret"] = os.environ[secret_environ]
        self.chunk_size = chunk_size
        self._provider_name = provider
        self._provider = get_driver(provider)(**provider_kwargs)
        self._container = self._provider.get_container(container)

    def get_uri(self, object_name: str) -> str:
        return f"{self._provider_name}://{self._container.name}/{object_name}"

    def _object(self, object_name: str) -> Any:
        from libcloud.storage.types import ObjectDoesNotExistError
        try:
            return self._provider.get_object(self._container.name, object_name)
        except ObjectDoesNotExistError as exc:
            raise FileNotFoundError(f"Object {self.get_uri(object_name)} not found") from exc

    def upload_object(self, object_name: str, filename: Union[str, pathlib.Path],
                      callback: Optional[Callable[[int, int], None]] = None,
                      **kwargs: Any) -> None:
        size = os.path.getsize(filename)
        with open(filename, "rb") as stream:
            self._provider.upload_object_via_stream(stream, self._container, object_name,
                                                    **kwargs)
        if callback is not None:
            callback(size, size)

    def get_object_size(self, object_name: str) -> int:
        return int(self._object(object_name).size)

    def download_object(self, object_name: str, filename: Union[str, pathlib.Path],
                        overwrite: bool = False,
                        callback: Optional[Callable[[int, int], None]] = None) -> None:
        filename = refuse_existing(filename, overwrite)
        obj = self._object(object_name)  # FileNotFoundError first, before a file
        with staged_download(filename) as tmp, open(tmp, "wb") as out:
            for chunk in self._provider.download_object_as_stream(obj, self.chunk_size):
                out.write(chunk)
        if callback is not None:
            callback(int(obj.size), int(obj.size))

    def list_objects(self, prefix: Optional[str] = None) -> list[str]:
        names = (o.name for o in self._provider.iterate_container_objects(self._container))
        return sorted(n for n in names if n.startswith(prefix or ""))
