"""The :class:`RemoteUploaderDownloader`: a :class:`LoggerDestination` that stores the files a
run hands to ``logger.upload_file`` (checkpoints, ``metrics.jsonl``) in object storage, in
background threads, with retries; and downloads them back.

Storage is any fsspec URL (``s3://bucket/prefix``, ``gs://bucket``, ``file:///path``...),
opened through :func:`cadence.checkpoint.remote.get_filesystem` (the same filesystems, extras
and credential rules as a remote ``save_folder``).

Source: MosaicML Composer's ``RemoteUploaderDownloader``
(``composer/loggers/remote_uploader_downloader.py``), on fsspec instead of Composer's
``ObjectStore`` classes.
"""

from __future__ import annotations

import collections
import logging
import os
import pathlib
import shutil
import tempfile
import threading
import time
import uuid
import warnings
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

from cadence.registry import loggers
from cadence.loggers.logger_destination import LoggerDestination
from cadence.utils import dist

if TYPE_CHECKING:
    from cadence.core.state import State

__all__ = ["RemoteUploaderDownloader", "is_transient",
           "maybe_create_remote_uploader_downloader_from_uri"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Composer's ``S3ObjectStore`` arguments that carry credentials: cadence reads credentials
#: only from the environment (as for a remote ``save_folder``).
_CREDENTIAL_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token",
                    "key", "secret", "token", "password")
#: Composer's ``S3ObjectStore`` / ``GCSObjectStore`` arguments, mapped onto fsspec's.
_CLIENT_KEYS = ("endpoint_url", "region_name")
_PERMANENT = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError,
              NotADirectoryError)


def is_transient(error: BaseException) -> bool:
    """Whether an upload or download failing with ``error`` is worth retrying: an
    :class:`OSError` (a connection reset, a timeout, a 5xx the filesystem library raised as
    one), but not a missing object, an existing one, or a refused permission."""
    return isinstance(error, OSError) and not isinstance(error, _PERMANENT)


def _with_retries(action: Callable[[], T], num_attempts: int, backoff_s: float,
                  what: str) -> T:
    """``action()``, retried on transient errors (:func:`is_transient`) up to
    ``num_attempts`` times in all, waiting ``backoff_s * 2**k`` seconds after failure ``k``."""
    for attempt in range(num_attempts):
        try:
            return action()
        except Exception as exc:
            if not is_transient(exc) or attempt == num_attempts - 1:
                raise
            wait = backoff_s * (2 ** attempt)
            log.warning("%s failed (%s: %s); attempt %d of %d, retrying in %.1fs.", what,
                        type(exc).__name__, exc, attempt + 1, num_attempts, wait)
            time.sleep(wait)
    raise AssertionError("unreachable")  # num_attempts >= 1 is checked in __init__


@loggers.register("remote_uploader_downloader")
class RemoteUploaderDownloader(LoggerDestination):
    """Uploads the files handed to ``logger.upload_file`` to an object store, and downloads
    files from it (:meth:`download_file`).

    Each ``upload_file`` copies the file into ``upload_staging_folder`` at once (so the run may
    change or delete it), then returns; ``num_concurrent_uploads`` background threads upload
    the copies to ``<bucket_uri>/<file_path_format_string>``. A file logged again under the
    same name before its upload started replaces the earlier copy (the newest wins; uploads of
    one name never overlap). A failed upload is retried (``num_attempts`` in all, exponential
    backoff from :attr:`retry_backoff_s`) when the error is transient
    (:func:`is_transient`); a failure that remains is raised on the training thread at the
    next ``BATCH_END``/``EPOCH_END``, or by :meth:`wait_for_workers` (called at ``FIT_END``,
    ``EVAL_STANDALONE_END`` and ``PREDICT_END``). ``post_close`` (after ``Trainer.close()``)
    uploads what is left, stops the threads and removes the staging folder it created.

    At ``INIT``, rank 0 writes the object ``.credentials_validated_successfully`` (formatted
    like any file) to check that the store accepts writes before training starts, as
    Composer does.

    Args:
        bucket_uri: where files go: an fsspec URL, ``s3://bucket``, ``gs://bucket/prefix``,
            ``file:///abs/path``. A path after the bucket is a prefix of every object name
            (Composer keeps only the bucket).
        backend_kwargs: options for the filesystem (fsspec ``storage_options``, e.g.
            ``{"anon": True}``, ``{"client_kwargs": {...}}``). Composer's ``S3ObjectStore``
            keys are mapped: ``bucket`` replaces the URL's bucket, ``prefix`` is prepended to
            object names, ``endpoint_url`` / ``region_name`` go to the client. Default none.
        file_path_format_string: the object name of each file, with ``{remote_file_name}``
            (the name given to ``upload_file``), ``{run_name}``, ``{rank}``, ``{local_rank}``,
            ``{world_size}``, ``{local_world_size}``, ``{node_rank}``; leading ``/`` removed.
            Default ``'{remote_file_name}'``.
        num_concurrent_uploads: upload threads (default 1; at least 1).
        upload_staging_folder: where copies wait for upload; default a new temporary folder,
            made at the first upload and removed at ``post_close``.
        use_procs: accepted for Composer's signature; uploads always run in threads here
            (network I/O releases the GIL, and the copy into the stage is made on the
            caller's thread), so it changes nothing. Default True.
        num_attempts: tries per upload or download on a transient error (default 3;
            at least 1).

    Raises:
        ValueError: ``num_concurrent_uploads`` or ``num_attempts`` below 1; credentials in
            ``backend_kwargs`` (they belong in the environment: ``AWS_ACCESS_KEY_ID``,
            ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ``GOOGLE_APPLICATION_CREDENTIALS``);
            an unknown protocol or a missing extra (``pip install 'cadence[s3]'``).
    """

    #: Seconds before the first retry (doubled each time).
    retry_backoff_s: float = 1.0

    def __init__(self, bucket_uri: str, backend_kwargs: Optional[dict[str, Any]] = None,
                 file_path_format_string: str = "{remote_file_name}",
                 num_concurrent_uploads: int = 1, upload_staging_folder: Optional[str] = None,
                 use_procs: bool = True, num_attempts: int = 3) -> None:
        if int(num_concurrent_uploads) < 1:
            raise ValueError(f"RemoteUploaderDownloader num_concurrent_uploads must be >= 1, got "
                             f"{num_concurrent_uploads!r} (uploads always run in the background).")
        if int(num_attempts) < 1:
            raise ValueError(f"RemoteUploaderDownloader num_attempts must be >= 1, got "
                             f"{num_attempts!r}.")
        kwargs = dict(backend_kwargs or {})
        secrets = sorted(k for k in kwargs if k in _CREDENTIAL_KEYS)
        if secrets:
            raise ValueError(
                f"RemoteUploaderDownloader backend_kwargs holds credentials ({secrets}); cadence "
                f"reads them only from the environment (AWS_ACCESS_KEY_ID / "
                f"AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE, "
                f"GOOGLE_APPLICATION_CREDENTIALS), never from code or a run file. Remove them "
                f"from backend_kwargs and set the environment instead.")
        self.bucket_uri = str(bucket_uri)
        self.backend_kwargs = kwargs
        self.file_path_format_string = file_path_format_string
        self.num_concurrent_uploads = int(num_concurrent_uploads)
        self.use_procs = bool(use_procs)
        self.num_attempts = int(num_attempts)
        self._url, self._storage_options, self._prefix = self._resolve(self.bucket_uri, kwargs)
        self._fs: Any = None
        self._root = ""
        self.remote_backend  # noqa: B018  (unknown protocols and missing extras fail now)
        self._tempdir: Optional[str] = None  # made on the first upload_file
        self._staging = upload_staging_folder
        self._run_name: Optional[str] = None
        self._cond = threading.Condition()
        self._pending: collections.OrderedDict[str, tuple[str, bool]] = collections.OrderedDict()
        self._in_flight: set[str] = set()
        self._errors: list[BaseException] = []
        self._reported = 0  # errors already raised on the training thread
        self._closing = False
        self._workers: list[threading.Thread] = []

    # ------------------------------------------------------------------ the store
    @staticmethod
    def _resolve(url: str, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any], str]:
        """(URL, fsspec storage options, object-name prefix) from Composer's arguments."""
        kwargs = dict(kwargs)
        scheme, sep, rest = url.partition("://")
        bucket = kwargs.pop("bucket", None)
        if bucket is not None and sep:
            tail = rest.split("/", 1)[1] if "/" in rest else ""
            url = f"{scheme}://{bucket}" + (f"/{tail}" if tail else "")
        prefix = str(kwargs.pop("prefix", "") or "").strip("/")
        client = {k: kwargs.pop(k) for k in _CLIENT_KEYS if k in kwargs}
        if client:
            kwargs["client_kwargs"] = {**kwargs.get("client_kwargs", {}), **client}
        return url.rstrip("/"), kwargs, prefix

    @property
    def remote_backend(self) -> Any:
        """The fsspec filesystem files go to (Composer: its ``ObjectStore``); built on first
        use, from the URL and ``backend_kwargs``."""
        if self._fs is None:
            from cadence.checkpoint.remote import get_filesystem, is_remote, local_path

            fs, root = get_filesystem(self._url)  # checks protocol, extra, no URL secrets
            if self._storage_options:
                import fsspec.core

                fs, root = fsspec.core.url_to_fs(self._url, **self._storage_options)
                root = root.rstrip("/")
            if not is_remote(self._url):
                root = str(local_path(self._url)).rstrip("/")
            self._fs, self._root = fs, root
        return self._fs

    def _key(self, object_name: str) -> str:
        parts = [p for p in (self._root, self._prefix, object_name.lstrip("/")) if p]
        return "/".join(parts)

    def get_uri_for_file(self, remote_file_name: str) -> str:
        """The URL of ``remote_file_name`` (formatted with ``file_path_format_string``) in the
        store, e.g. ``s3://bucket/run/ep1-ba4-rank0.pt``."""
        self.remote_backend  # noqa: B018
        key = self._key(self._remote_file_name(remote_file_name))
        protocol = self._url.partition("://")[0] if "://" in self._url else "file"
        return f"{protocol}://{key}"

    def _remote_file_name(self, remote_file_name: str, run_name: Optional[str] = None) -> str:
        """``remote_file_name`` through ``file_path_format_string``."""
        run_name = run_name or self._run_name
        if run_name is None:
            raise RuntimeError("RemoteUploaderDownloader: the run name is not known yet; it is "
                               "set at Event.INIT (or by the first upload_file).")
        values = dict(remote_file_name=remote_file_name, run_name=run_name,
                      rank=dist.get_global_rank(), local_rank=dist.get_local_rank(),
                      world_size=dist.get_world_size(),
                      local_world_size=dist.get_local_world_size(),
                      node_rank=dist.get_node_rank())
        try:
            name = self.file_path_format_string.format(**values)
        except (KeyError, IndexError) as exc:
            raise ValueError(f"RemoteUploaderDownloader file_path_format_string "
                             f"{self.file_path_format_string!r} has the unknown field {exc}; "
                             f"known: {sorted(values)}.") from None
        return name.lstrip("/")

    # ------------------------------------------------------------------ events
    def init(self, state: State, logger: Any) -> None:
        del logger
        self._run_name = state.run_name
        if dist.get_global_rank() == 0:
            name = self._remote_file_name(".credentials_validated_successfully")
            key = self._key(name)
            _with_retries(lambda: self._pipe(key, b"credentials_validated_successfully"),
                          self.num_attempts, self.retry_backoff_s, f"Writing {key}")

    def _pipe(self, key: str, data: bytes) -> None:
        self._make_parent(key)
        self._fs.pipe_file(key, data)

    def _make_parent(self, key: str) -> None:
        """A local store's parent folder (object stores have none to make)."""
        from cadence.checkpoint.remote import is_remote

        if not is_remote(self._url) and "/" in key:
            self._fs.makedirs(key.rsplit("/", 1)[0], exist_ok=True)

    def batch_end(self, state: State, logger: Any) -> None:
        del state, logger
        self._check_workers()

    def epoch_end(self, state: State, logger: Any) -> None:
        del state, logger
        self._check_workers()

    def fit_end(self, state: State, logger: Any) -> None:
        del logger
        self.wait_for_workers(state.device)

    def eval_standalone_end(self, state: State, logger: Any) -> None:
        del logger
        self.wait_for_workers(state.device)

    def predict_end(self, state: State, logger: Any) -> None:
        del logger
        self.wait_for_workers(state.device)

    # ------------------------------------------------------------------ uploads
    def can_upload_files(self) -> bool:
        """True: this destination stores files."""
        return True

    def upload_file(self, state: State, remote_file_name: str, file_path: pathlib.Path, *,
                    overwrite: bool) -> None:
        """Copy ``file_path`` into the staging folder and queue it for upload as
        ``file_path_format_string.format(remote_file_name=..., ...)``.

        Raises:
            FileExistsError: the same object is already queued and ``overwrite`` is False
                (an object already in the store is found by the worker and raised later).
            RuntimeError: the uploader was closed.
            Exception: an earlier upload's failure, not raised yet.
        """
        self._check_workers()
        if self._closing:
            raise RuntimeError("RemoteUploaderDownloader.upload_file after post_close().")
        self._run_name = self._run_name or state.run_name
        name = self._remote_file_name(remote_file_name, state.run_name)
        if self._staging is None:
            self._tempdir = self._staging = tempfile.mkdtemp(prefix="cadence-rud-")
        os.makedirs(self._staging, exist_ok=True)
        copy = os.path.join(self._staging, uuid.uuid4().hex)
        shutil.copy2(file_path, copy)
        with self._cond:
            if name in self._pending and not overwrite:
                os.remove(copy)
                raise FileExistsError(f"Object {name} is already queued for upload, and "
                                      f"overwrite=False.")
            replaced = self._pending.pop(name, None)
            if replaced is not None:
                _remove_quietly(replaced[0])  # the newest copy wins
            self._pending[name] = (copy, overwrite)
            self._start_workers()
            self._cond.notify_all()

    def _start_workers(self) -> None:
        if not self._workers:
            self.remote_backend  # noqa: B018  (built once, shared by the threads)
            for index in range(self.num_concurrent_uploads):
                worker = threading.Thread(target=self._work, daemon=True,
                                          name=f"cadence-upload-{index}")
                worker.start()
                self._workers.append(worker)

    def _work(self) -> None:
        """An upload thread: take a queued name not being uploaded, upload it, repeat; end
        when closing and nothing is queued."""
        while True:
            with self._cond:
                while True:
                    name = next((n for n in self._pending if n not in self._in_flight), None)
                    if name is not None or (self._closing and not self._pending):
                        break
                    self._cond.wait()
                if name is None:
                    return
                copy, overwrite = self._pending.pop(name)
                self._in_flight.add(name)
            try:
                self._upload(copy, name, overwrite)
            except BaseException as exc:  # raised on the training thread
                log.error("Upload of %s failed: %s: %s", name, type(exc).__name__, exc)
                with self._cond:
                    self._errors.append(exc)
            finally:
                _remove_quietly(copy)
                with self._cond:
                    self._in_flight.discard(name)
                    self._cond.notify_all()

    def _upload(self, copy: str, name: str, overwrite: bool) -> None:
        key = self._key(name)
        uri = f"{self._url.partition('://')[0]}://{key}" if "://" in self._url else key

        def attempt() -> None:
            if not overwrite and self._fs.exists(key):
                raise FileExistsError(f"Object {uri} already exists, and overwrite=False.")
            log.info("Uploading %s to %s", copy, uri)
            self._make_parent(key)
            self._fs.put_file(copy, key)

        _with_retries(attempt, self.num_attempts, self.retry_backoff_s, f"Upload to {uri}")
        self._fs.invalidate_cache()

    def _check_workers(self) -> None:
        """Raise the first upload failure not raised yet."""
        with self._cond:
            if self._reported < len(self._errors):
                error = self._errors[self._reported]
                self._reported = len(self._errors)
                raise error

    def wait_for_workers(self, device: Any = None) -> None:
        """Block until every queued file is uploaded (this rank's), then raise the first
        upload failure not raised yet. ``device`` is accepted for Composer's signature."""
        del device
        with self._cond:
            while (self._pending or self._in_flight) and self._workers and \
                    any(w.is_alive() for w in self._workers):
                self._cond.wait(timeout=0.5)
        self._check_workers()

    def post_close(self) -> None:
        """Upload what is queued, stop the threads, remove the staging folder this object
        made; objects that could not be uploaded are named in a ``RuntimeWarning``.
        Idempotent."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for worker in self._workers:
            worker.join()
        self._workers.clear()
        with self._cond:
            left = list(self._pending)
            failed = self._errors[self._reported:]
            self._reported = len(self._errors)
            for copy, _ in self._pending.values():
                _remove_quietly(copy)
            self._pending.clear()
        if left or failed:
            warnings.warn(RuntimeWarning(
                f"RemoteUploaderDownloader: {len(failed)} upload(s) failed "
                f"({'; '.join(f'{type(e).__name__}: {e}' for e in failed)})"
                + (f", and these were never uploaded: {', '.join(left)}" if left else "")
                + "."), stacklevel=2)
        if self._tempdir is not None:
            shutil.rmtree(self._tempdir, ignore_errors=True)
            self._tempdir = self._staging = None

    # ------------------------------------------------------------------ downloads
    def download_file(self, remote_file_name: str, destination: str, overwrite: bool = False,
                      progress_bar: bool = True) -> None:
        """Download object ``remote_file_name`` (a name in the store, under the prefix; not
        run through ``file_path_format_string``, as in Composer) to the local path
        ``destination``, through a temporary file renamed when complete; transient errors
        are retried (``num_attempts``).

        Raises:
            FileExistsError: ``destination`` exists and ``overwrite`` is False.
            FileNotFoundError: no such object.
        """
        if os.path.exists(destination) and not overwrite:
            raise FileExistsError(f"{destination} exists; pass overwrite=True to replace it.")
        fs = self.remote_backend
        key = self._key(remote_file_name)
        parent = os.path.dirname(os.path.abspath(destination))
        os.makedirs(parent, exist_ok=True)
        tmp = os.path.join(parent, f".{os.path.basename(destination)}.{uuid.uuid4().hex}.tmp")

        def attempt() -> None:
            kwargs: dict[str, Any] = {}
            if progress_bar and dist.get_local_rank() == 0:
                from fsspec.callbacks import TqdmCallback

                kwargs["callback"] = TqdmCallback(tqdm_kwargs={"desc": remote_file_name,
                                                               "unit": "B", "unit_scale": True})
            fs.get_file(key, tmp, **kwargs)

        try:
            _with_retries(attempt, self.num_attempts, self.retry_backoff_s,
                          f"Download of {key}")
            os.replace(tmp, destination)
        finally:
            _remove_quietly(tmp)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def maybe_create_remote_uploader_downloader_from_uri(
        uri: str, loggers: list[LoggerDestination]) -> Optional[RemoteUploaderDownloader]:
    """A :class:`RemoteUploaderDownloader` for the bucket of ``uri`` (Composer's
    ``composer.utils.maybe_create_remote_uploader_downloader_from_uri``, also importable from
    :mod:`cadence.utils`).

    Returns None for a local path, and (with a warning) when ``loggers`` already holds a
    ``RemoteUploaderDownloader`` for the same protocol and bucket. ``azure://`` is fsspec's
    ``az://``.

    Raises:
        NotImplementedError: ``wandb://`` (use ``WandBLogger(log_artifacts=True)``) or
            ``dbfs:/`` (Databricks has no object store in cadence).
        ValueError: the protocol is unknown to fsspec or its package is missing.
    """
    from cadence.utils.file_helpers import fsspec_protocol, parse_uri

    backend, bucket, _ = parse_uri(uri)
    if backend == "":
        return None
    if backend == "wandb":
        raise NotImplementedError("There is no implementation for WandB via URI. Please use "
                                  "WandBLogger with log_artifacts set to True.")
    if backend == "dbfs":
        raise NotImplementedError("Databricks (dbfs:/) has no object store in cadence; use an "
                                  "s3:// or gs:// bucket.")
    backend = fsspec_protocol(backend)
    for existing in loggers:
        if isinstance(existing, RemoteUploaderDownloader):
            theirs = parse_uri(existing.bucket_uri)
            if (fsspec_protocol(theirs[0]), theirs[1]) == (backend, bucket):
                warnings.warn(f"There already exists a RemoteUploaderDownloader object to "
                              f"handle the uri: {uri} you specified", stacklevel=2)
                return None
    return RemoteUploaderDownloader(bucket_uri=f"{backend}://{bucket}")
