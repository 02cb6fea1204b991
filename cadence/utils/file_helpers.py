"""Composer's ``composer.utils.file_helpers``: URIs (``s3://bucket/path``), fetching a file
from a local path, an object store or an ``http(s)`` URL, object stores from URIs, and
formatting names with the run's distributed and time fields.

Every remote protocol goes through fsspec (:class:`FsspecObjectStore`, an
:class:`~cadence.utils.object_store.ObjectStore`),
so ``s3://``, ``gs://``, ``oci://``, ``az://`` (Composer's ``azure://``) and any other
installed fsspec protocol work alike; ``wandb://`` and ``dbfs:/`` (Databricks) have no
implementation and are refused, as Composer refuses ``wandb://``.

:func:`maybe_create_remote_uploader_downloader_from_uri` (same module in Composer) lives
beside :class:`~cadence.loggers.RemoteUploaderDownloader`, which it builds, and is importable
from :mod:`cadence.utils`.

Source: Composer 0.32.1 ``composer/utils/file_helpers.py`` (names, arguments, return
values, the ``.symlink`` text-file convention of ``get_file``, the format fields).
"""

from __future__ import annotations

import os
import pathlib
import tempfile
from typing import Any, Callable, Optional, Union
from urllib.parse import urlparse

from cadence.core.time import Timestamp
from cadence.utils import dist
from cadence.utils.misc import partial_format
from cadence.checkpoint.remote import get_filesystem, is_remote, local_path
from cadence.utils.object_store import ObjectStore
from cadence.utils.object_store.object_store import refuse_existing, staged_download

__all__ = ["FsspecObjectStore", "format_name_with_dist", "format_name_with_dist_and_time", "fsspec_protocol",
           "get_file", "is_uri",
           "list_remote_objects", "maybe_create_object_store_from_uri", "parse_uri"]

#: Composer's backend names that fsspec spells otherwise.
_FSSPEC_PROTOCOL = {"azure": "az"}


def fsspec_protocol(backend: str) -> str:
    """The fsspec protocol of a Composer backend name (``azure`` -> ``az``; others as they
    are)."""
    return _FSSPEC_PROTOCOL.get(backend, backend)

#: Backends with no implementation here, and what to use instead.
_UNSUPPORTED = {
    "wandb": "There is no implementation for WandB load_object_store via URI. Please use "
             "WandBLogger (log_artifacts=True).",
    "dbfs": "Databricks (dbfs:/, Unity Catalog volumes, MLflow artifacts) has no object store "
            "in cadence; copy the files to s3:// or gs:// (or a local path) first.",
}


class FsspecObjectStore(ObjectStore):
    """Objects under the fsspec URL ``root`` (``s3://bucket``, ``gs://bucket/prefix``,
    ``file:///abs/dir`` or a plain local folder): object ``a/b.pt`` is ``<root>/a/b.pt``.

    Args:
        root: the URL (or local folder) that object names are relative to.
        storage_options: keyword arguments for the fsspec filesystem of ``root``'s protocol
            (e.g. s3fs's ``endpoint_url``, ``key``, ``secret``); default None: the protocol's
            defaults, credentials from the environment. The provider classes of
            :mod:`cadence.utils.object_store` (``S3ObjectStore``...) pass their arguments here.

    Raises:
        ValueError: the protocol is unknown or its fsspec package is not installed (the
            message names the extra), or the URL carries credentials.
    """

    def __init__(self, root: str, storage_options: Optional[dict[str, Any]] = None) -> None:
        self.root = str(root).rstrip("/")
        if storage_options:  # the filesystem from its options (url_to_fs might connect)
            import fsspec

            protocol = self.root.split("://", 1)[0]
            self._fs = fsspec.filesystem(protocol, **storage_options)
            path = str(self._fs._strip_protocol(self.root)).rstrip("/")
        else:
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
        filename = refuse_existing(filename, overwrite)
        size = self.get_object_size(object_name)  # FileNotFoundError first, before a file
        with staged_download(filename) as tmp:
            self._fs.get_file(self._key(object_name), tmp)
        if callback is not None:
            callback(size, size)

    def list_objects(self, prefix: Optional[str] = None) -> list[str]:
        self._fs.invalidate_cache()
        base = self._path.rstrip("/") if self._remote else self._path
        found = self._fs.find(base)
        names = sorted(key[len(base):].lstrip("/") for key in found)
        return [n for n in names if n.startswith(prefix or "")]


def _dist_fields() -> dict[str, int]:
    """``rank``, ``local_rank``, ``world_size``, ``local_world_size``, ``node_rank``."""
    return {"rank": dist.get_global_rank(), "local_rank": dist.get_local_rank(),
            "world_size": dist.get_world_size(),
            "local_world_size": dist.get_local_world_size(), "node_rank": dist.get_node_rank()}


def format_name_with_dist(format_str: str, run_name: str, **extra_format_kwargs: object) -> str:
    """``format_str`` with ``{run_name}``, the distributed fields (``{rank}``,
    ``{local_rank}``, ``{world_size}``, ``{local_world_size}``, ``{node_rank}``) and
    ``extra_format_kwargs`` filled; other fields are left as written."""
    return partial_format(format_str, run_name=run_name, **_dist_fields(), **extra_format_kwargs)


def format_name_with_dist_and_time(format_str: str, run_name: str, timestamp: Timestamp,
                                   **extra_format_kwargs: object) -> str:
    """``format_str`` with :func:`format_name_with_dist`'s fields and the time fields of
    ``timestamp``: ``{epoch}``, ``{batch}``, ``{batch_in_epoch}``, ``{sample}``,
    ``{sample_in_epoch}``, ``{token}``, ``{token_in_epoch}`` (ints), ``{total_wct}``,
    ``{epoch_wct}``, ``{batch_wct}`` (seconds, floats). Other fields are left as written.

    Example: ``'{run_name}/ep{epoch}-ba{batch}-rank{rank}.{extension}'`` with
    ``extension='json'`` at epoch 0, batch 0 on rank 0 -> ``'run/ep0-ba0-rank0.json'``.
    """
    ts = timestamp
    return partial_format(
        format_str, run_name=run_name, epoch=int(ts.epoch), batch=int(ts.batch),
        batch_in_epoch=int(ts.batch_in_epoch), sample=int(ts.sample),
        sample_in_epoch=int(ts.sample_in_epoch), token=int(ts.token),
        token_in_epoch=int(ts.token_in_epoch), total_wct=ts.total_wct.total_seconds(),
        epoch_wct=ts.epoch_wct.total_seconds(), batch_wct=ts.batch_wct.total_seconds(),
        **_dist_fields(), **extra_format_kwargs)


def parse_uri(uri: Union[str, pathlib.Path]) -> tuple[str, str, str]:
    """``(backend, bucket, path)`` of a URI: ``'s3://bucket/a/b.pt'`` ->
    ``('s3', 'bucket', 'a/b.pt')``; a local path -> ``('', '', path)`` (the path unchanged).
    A ``user@bucket`` net location gives ``user``'s part before ``@`` (Composer's rule).
    ``AZURE_BLOBS`` in a URI is read as ``azure``."""
    uri = str(uri).replace("AZURE_BLOBS", "azure")
    parsed = urlparse(uri)
    bucket = parsed.netloc.split("@")[0]
    if parsed.scheme == "":
        return "", bucket, parsed.path
    return parsed.scheme, bucket, parsed.path.lstrip("/")


def is_uri(path: str) -> bool:
    """Whether ``path`` has a backend (``s3://...``), i.e. is not a local path."""
    return parse_uri(path)[0] != ""


def maybe_create_object_store_from_uri(uri: str) -> Optional[ObjectStore]:
    """An object store for the bucket of ``uri``, or None for a local path.

    ``s3://bucket/path`` -> a store rooted at ``s3://bucket`` (object names are the paths
    inside the bucket, as :func:`parse_uri` gives them). Any fsspec protocol is accepted
    (``file://`` included); ``azure://`` is fsspec's ``az://``.

    Raises:
        NotImplementedError: ``wandb://`` or ``dbfs:/`` (no implementation; the message says
            what to use).
        ValueError: the protocol is unknown to fsspec, or its package is missing (the message
            names the extra, ``pip install 'cadence[s3]'``).
    """
    backend, bucket, _ = parse_uri(uri)
    if backend == "":
        return None
    if backend in _UNSUPPORTED:
        raise NotImplementedError(_UNSUPPORTED[backend])
    if backend == "file":
        return FsspecObjectStore("/")
    return FsspecObjectStore(f"{fsspec_protocol(backend)}://{bucket}")


def list_remote_objects(remote_path: str) -> list[str]:
    """The names of the objects under ``remote_path`` (``s3://bucket/prefix``), relative to
    its bucket.

    Raises:
        ValueError: ``remote_path`` is a local path.
    """
    store = maybe_create_object_store_from_uri(remote_path)
    if store is None:
        raise ValueError(f"list_remote_objects needs a remote path (s3://bucket/prefix, ...); "
                         f"{remote_path!r} is a local path.")
    return store.list_objects(parse_uri(remote_path)[2])


def get_file(path: str, destination: str,
             object_store: Optional[Union[ObjectStore, Any]] = None,
             overwrite: bool = False, progress_bar: bool = True) -> None:
    """Fetch ``path`` to the local file ``destination``.

    - ``object_store`` given: ``path`` is an object name in it (an :class:`ObjectStore`, or a
      logger destination with ``download_file``, e.g. ``RemoteUploaderDownloader``).
    - ``path`` a URI (``s3://bucket/x``, ``http(s)://...``): downloaded through fsspec.
    - otherwise ``path`` is a local file, and ``destination`` becomes a symlink to it.

    When ``path`` ends in ``.symlink`` it is a text file holding the real object's name
    (Composer's convention), which is fetched instead; when ``path`` is missing but
    ``path + '.symlink'`` exists, that is followed.

    Args:
        progress_bar: accepted for Composer's signature; no bar is drawn.

    Raises:
        FileNotFoundError: ``path`` does not exist (naming ``path``).
        FileExistsError: ``destination`` exists and ``overwrite`` is False.
    """
    del progress_bar
    if object_store is None:
        if path.lower().startswith(("http://", "https://")):
            base, _, name = path.rpartition("/")
            object_store, path = FsspecObjectStore(base), name
        else:
            object_store = maybe_create_object_store_from_uri(path)
            path = parse_uri(path)[2] if object_store is not None else path
    if path.endswith(".symlink"):
        with tempfile.TemporaryDirectory() as tmp:
            link = os.path.join(tmp, "file.symlink")
            _get_file(path, link, object_store, overwrite=False)
            with open(link) as f:
                real_path = f.read().strip()
        return get_file(real_path, destination, object_store, overwrite)
    try:
        _get_file(path, destination, object_store, overwrite)
    except FileNotFoundError as exc:
        try:
            return get_file(path + ".symlink", destination, object_store, overwrite)
        except FileNotFoundError as inner:
            raise exc from inner


def _get_file(path: str, destination: str, object_store: Any, overwrite: bool) -> None:
    """One fetch, no ``.symlink`` handling."""
    if object_store is not None:
        if isinstance(object_store, ObjectStore):
            object_store.download_object(object_name=path, filename=destination,
                                         overwrite=overwrite)
        else:  # a LoggerDestination that downloads (RemoteUploaderDownloader)
            object_store.download_file(remote_file_name=path, destination=destination,
                                       overwrite=overwrite)
        return
    if not os.path.exists(path):
        raise FileNotFoundError(f"Local path {path} does not exist")
    if os.path.lexists(destination):
        if not overwrite:
            raise FileExistsError(f"{destination} exists; pass overwrite=True to replace it.")
        os.remove(destination)
    os.symlink(os.path.abspath(path), destination)
