"""``load_object_store``: fetch ``load_path`` from an object store before loading it.

Composer's ``Trainer(load_path=name, load_object_store=store)`` reads the checkpoint
``name`` from ``store``. ``store`` may be:

- an fsspec URL (``s3://bucket/runs``, ``gs://...``, ``file:///...``): the checkpoint is
  ``<store>/<load_path>``, fetched as any remote ``load_path`` is
  (:func:`~cadence.checkpoint.remote.fetched`: a full file or a sharded folder);
- an object with Composer's ``ObjectStore`` API, ``download_object(object_name, filename,
  overwrite=..., callback=...)``;
- an object with ``RemoteUploaderDownloader``'s, ``download_file(remote_file_name,
  destination, overwrite=..., progress_bar=...)`` (duck-typed: any class with the method).

An object store's checkpoint must be one ``full`` file: every rank downloads its own copy
into a temporary folder, removed once loaded. What is downloaded is loaded as any
checkpoint is (restricted unpickling, checksums).

Source: Composer 0.32.1 ``Trainer(load_object_store=)`` and ``utils/checkpoint.py``
(``download_checkpoint``).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any, Iterator, Optional, Union

from cadence.checkpoint.errors import CheckpointError
from cadence.checkpoint.remote import fetched, join
from cadence.utils import dist

__all__ = ["check_object_store", "fetched_from_store"]


def check_object_store(store: Any) -> None:
    """Refuse, before anything is built, a ``load_object_store`` that is neither a URL nor
    an object with ``download_object`` / ``download_file``.

    Raises:
        TypeError: naming the argument, what was given and what is accepted.
    """
    if store is None or isinstance(store, str):
        return
    if not (callable(getattr(store, "download_object", None))
            or callable(getattr(store, "download_file", None))):
        raise TypeError(
            f"load_object_store must be an fsspec URL (e.g. 's3://bucket/runs'), an "
            f"ObjectStore (with download_object) or a RemoteUploaderDownloader (with "
            f"download_file); got {type(store).__name__}.")


def _download(store: Any, name: str, dest: Path) -> None:
    """The required arguments only (a fresh ``dest``: nothing to overwrite)."""
    if callable(getattr(store, "download_object", None)):
        store.download_object(object_name=name, filename=str(dest))
    else:
        store.download_file(remote_file_name=name, destination=str(dest))


@contextlib.contextmanager
def fetched_from_store(store: Union[str, Any], load_path: Union[str, Path]) -> Iterator[Path]:
    """A local copy of checkpoint ``load_path`` in ``store`` (see the module docstring),
    removed on leaving. Call on every rank.

    Raises:
        CheckpointError: on every rank, when the download failed or left no file on any
            rank (naming the store and the name).
    """
    name = str(load_path).lstrip("/")
    if isinstance(store, str):
        with fetched(join(store, name)) as local:
            yield local
        return
    tmp = Path(tempfile.mkdtemp(prefix="cadence-load-"))
    dest = tmp / (PurePosixPath(name).name or "checkpoint.pt")
    try:
        error: Optional[str] = None
        try:
            _download(store, name, dest)
            if not dest.is_file():
                error = (f"The object store {type(store).__name__} wrote no file for {name!r} "
                         f"(only full checkpoints, one file, can be loaded from an object "
                         f"store object; for a sharded folder give the store as a URL).")
        except Exception as exc:  # noqa: BLE001 - any store's failure, reported by name
            error = (f"Cannot download checkpoint {name!r} from {type(store).__name__} (the "
                     f"object store): {type(exc).__name__}: {exc}")
        errors = [e for e in dist.all_gather_object(error) if e is not None]
        if errors:  # every rank raises, so none waits in the load's collectives
            raise CheckpointError(errors[0])
        yield dest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
