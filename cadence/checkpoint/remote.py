"""Checkpoints in object storage: a ``save_folder`` / ``load_path`` that is an fsspec URL
(``s3://bucket/runs/x``, ``gs://...``, any installed fsspec protocol; a plain path or
``file://`` stays local).

A remote checkpoint is written locally first, then uploaded (each rank its own files), so
everything the local save guarantees (hashing while writing, the CRC32C manifest or zip
comment, the restricted unpicklers on load) carries over unchanged:

1. Every rank writes its part into the run's *stage* folder (:func:`stage_dir`) under the
   temporary name, as a local save does; then uploads the files it wrote to
   ``<url>/<name>`` (``full``: rank 0 the one file; ``sharded``: rank ``r`` its
   ``__r_*.distcp`` shards, rank 0 also ``.metadata``, ``extra.pt``, ``manifest.json``).
2. Once every rank's upload is done, rank 0 writes the *completion marker*
   ``<url>/<name>.cadence-complete`` (JSON: run name, format, epoch, batch, time, and the
   manifest's CRC32C), then the ``latest`` pointer object. Object stores have no atomic
   rename: a checkpoint is complete when its marker exists, and only then listed, pointed
   at, resumed from or loaded. An upload killed half way leaves objects without a marker,
   never taken for a checkpoint; the resumed run's save of that name replaces them once they
   fail their checks (:meth:`RemoteFolder.inspect_unmarked`).

A missing marker alone never condemns data: a checkpoint whose files all pass their
checksums is complete, marker or not. Autoresume downloads and verifies every unmarked
checkpoint of the run (:meth:`RemoteFolder.repair_markers`): one that passes gets its
marker rewritten (logged as a WARNING) and is resumed from like any other; one that fails is
kept and ignored (WARNING). A save over unmarked objects verifies them first: complete ones
are refused as a complete checkpoint of that name is, and only objects that fail their
checks are removed (WARNING, naming why).
3. The staged copy is removed: the stage holds at most the checkpoint being written, a
   downloaded one, and the run's logs (``metrics.jsonl``, uploaded at every save and at
   ``close()``).

Loading downloads into the stage, then loads the local copy with the usual checks (every
file against its CRC32C). Credentials and endpoints come from the environment the
filesystem library reads (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``GOOGLE_APPLICATION_CREDENTIALS``...), never from the
run file. The stage lives under ``$XDG_CACHE_HOME/cadence/remote`` (default
``~/.cache/cadence/remote``), one folder per URL and host.

Source: fsspec (``fsspec.core.url_to_fs``), s3fs, gcsfs; Composer's remote ``save_folder``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import Any, Iterator, Optional, Union

import crc32c

from cadence.utils import dist
from cadence.checkpoint.errors import CheckpointError
from cadence.checkpoint.files import (
    MANIFEST_FILE, METADATA_FILE, TMP_MARK, is_aside, is_complete, remove_checkpoint,
)
from cadence.checkpoint.store import UNREADABLE, CheckpointStore

__all__ = ["COMPLETE_SUFFIX", "RemoteFolder", "check_url", "fetched", "get_filesystem",
           "is_remote", "join", "local_path", "split_url", "stage_dir", "uploaded"]

log = logging.getLogger(__name__)

#: Suffix of a checkpoint's completion marker, an object beside it.
COMPLETE_SUFFIX = ".cadence-complete"
#: URL protocol -> the cadence extra that installs its fsspec implementation.
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")  # DCP's FileSystemWriter: __<rank>_<n>.distcp
_ARTIFACTS = ("*.jsonl", "hparams.json")  # the run's logs, uploaded beside its checkpoints

PathLike = Union[str, os.PathLike]


def is_remote(path: Optional[PathLike]) -> bool:
    """Whether ``path`` is a URL of a remote filesystem (``s3://``, ``gs://``, ...); plain
    paths and ``file://`` URLs are local."""
    if path is None:
        return False
    match = _URL.match(os.fspath(path))
    return match is not None and match.group(1).lower() not in ("file", "local")


def local_path(path: PathLike) -> Path:
    """``path`` as a local path (a ``file://`` URL's path)."""
    text = os.fspath(path)
    return Path(text[len("file://"):]) if text.startswith("file://") else Path(text)


def join(url: str, name: str) -> str:
    """``url`` + ``/`` + ``name``."""
    return f"{url.rstrip('/')}/{name}"


def split_url(url: str) -> tuple[str, str]:
    """``s3://b/runs/x/ep1-ba8`` -> (``s3://b/runs/x``, ``ep1-ba8``)."""
    parent, _, name = url.rstrip("/").rpartition("/")
    if not name or parent.endswith(":/"):
        raise ValueError(f"{url!r} names no object inside a bucket; give <bucket>/<path>.")
    return parent, name


def get_filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem for ``url`` and the path inside it (no trailing ``/``). Nothing
    is contacted: credentials are read from the environment when first needed.

    Raises:
        ValueError: the protocol is unknown to fsspec, or its package is not installed (the
            message names the extra: ``pip install 'cadence[s3]'``), or the URL carries
            credentials (they belong in the environment).
    """
    match = _URL.match(url)
    protocol = match.group(1).lower() if match else "file"
    if "@" in url.split("://", 1)[-1].split("/", 1)[0]:
        raise ValueError(f"{url!r} carries credentials in the URL; cadence reads them only from "
                         f"the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
                         f"AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS...), never from a run "
                         f"file. Remove 'user:secret@' from the URL.")
    extra = EXTRAS.get(protocol)
    fix = (f"pip install 'cadence[{extra}]'" if extra is not None
           else f"install the fsspec implementation of {protocol}://")
    try:
        import fsspec.core

        fs, root = fsspec.core.url_to_fs(url)
    except ImportError as exc:
        raise ValueError(f"{url!r} needs the {protocol}:// filesystem, which is not installed "
                         f"({exc}); {fix}.") from None
    except ValueError as exc:  # fsspec: "Protocol not known: xyz"
        raise ValueError(f"{url!r}: {exc}; {fix}, or give a local path.") from None
    return fs, root.rstrip("/")


def check_url(url: str) -> bool:
    """For config checks: ``True`` when ``url`` is local or its filesystem is installed.

    Raises:
        ValueError: as :func:`get_filesystem`.
    """
    if is_remote(url):
        get_filesystem(url)
    return True


def stage_dir(url: str) -> Path:
    """The local folder where checkpoints of the remote folder ``url`` are written before
    upload and downloaded before loading: ``$XDG_CACHE_HOME/cadence/remote/<hash of
    url>/<host>`` (default ``~/.cache/cadence/remote/...``); per host, so nodes sharing a
    home directory do not write into one another's."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    digest = hashlib.sha1(url.rstrip("/").encode()).hexdigest()[:16]
    return Path(cache) / "cadence" / "remote" / digest / socket.gethostname()


def _owner(name: str) -> int:
    """The rank that uploads file ``name`` of a sharded checkpoint (its shards: the rank
    DCP named them after; the rest, written by the coordinator: rank 0)."""
    match = _SHARD.match(name)
    return int(match.group(1)) if match else 0


def _plain_name(name: str, where: str) -> str:
    """``name`` if it is a plain object name inside its folder (no ``/``, no ``..``)."""
    if not name or "/" in name or name in (".", "..") or any(ord(c) < 32 for c in name):
        raise CheckpointError(f"{where} names {name!r}, which is not an object inside its "
                              f"folder; refusing to follow it.")
    return name


class RemoteFolder(CheckpointStore):
    """A remote run folder: its checkpoints, markers, ``latest`` pointer and logs; the
    object-storage backend of :class:`~cadence.checkpoint.store.CheckpointStore` (complete:
    a completion marker; a set-aside: copy, then delete; a candidate that fails to download
    is rejected like one that fails its checksums).

    Args:
        url: the folder's URL (``s3://bucket/runs/x``).

    Raises:
        ValueError: as :func:`get_filesystem`.
    """

    def __init__(self, url: str) -> None:
        self.url = self.where = url.rstrip("/")
        self.fs, self.root = get_filesystem(self.url)
        self.stage = stage_dir(self.url)
        self._markers: dict[str, dict[str, Any]] = {}  # the last listing's

    fresh_start = f"Delete them (or their {COMPLETE_SUFFIX} markers) to start afresh"
    copy_errors = (CheckpointError, OSError)

    def _key(self, name: str) -> str:
        return f"{self.root}/{name}"

    def url_of(self, name: str) -> str:
        """The URL of ``name`` in this folder."""
        return join(self.url, name)

    location = url_of

    # ------------------------------------------------------------------ the store's backend
    def read_object(self, name: str) -> Optional[bytes]:
        try:
            return self.fs.cat_file(self._key(name))
        except FileNotFoundError:
            return None

    def write_object(self, name: str, data: bytes) -> None:
        self.fs.pipe_file(self._key(name), data)

    def exists(self, name: str) -> bool:
        return bool(self.fs.exists(self._key(name)))

    def is_complete(self, name: str) -> bool:
        return self.marker(name) is not None

    def complete(self) -> list[tuple[str, float]]:
        self._markers = self.markers()
        return [(name, float(doc.get("saved_at", 0))) for name, doc in self._markers.items()
                if not is_aside(name)]

    def owner(self, name: str) -> Any:
        doc = self._markers.get(name) or self.marker(name)
        return UNREADABLE if doc is None else doc.get("run_name")

    def rename(self, name: str, new: str) -> None:
        """Object stores have no rename: every object is copied first, then the marker is
        removed (it is no candidate any more), then the originals. A crash part way leaves a
        copy and, at worst, an unmarked original (kept, never resumed from)."""
        key, new_key = self._key(name), self._key(new)
        sources = [k for k in self.fs.find(key) if k != key] if self.fs.isdir(key) else [key]
        self.fs.copy(sources, [new_key + k[len(key):] for k in sources])
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(key + COMPLETE_SUFFIX)
        self.fs.rm(sources)
        self._refresh()

    def local_copy(self, name: str) -> Path:
        return self.download(name)

    def drop_copy(self, name: str) -> None:
        remove_checkpoint(self.stage / "loaded" / name)  # a rejected copy

    def before_resume(self, run_name: Optional[str]) -> None:
        self.repair_markers(run_name)  # a lost marker never condemns a checkpoint that verifies

    def _refresh(self) -> None:
        self.fs.invalidate_cache()  # another process may have changed the folder

    # ------------------------------------------------------------------ writing
    def upload_part(self, local: Path, name: str, rank: int) -> None:
        """Upload this rank's files of the checkpoint written locally at ``local`` (a full
        file or a sharded directory) as ``name`` (see the module docstring).

        Raises:
            OSError: the upload failed (``filename``: the file being uploaded).
        """
        if local.is_file():
            pairs = [(local, self._key(name))] if rank == 0 else []
        else:
            pairs = [(f, f"{self._key(name)}/{f.name}") for f in sorted(local.iterdir())
                     if f.is_file() and _owner(f.name) == rank]
        if not pairs:
            return
        try:
            self.fs.put([str(src) for src, _ in pairs], [dst for _, dst in pairs])
        except OSError as exc:
            raise type(exc)(exc.errno, f"upload to {self.url_of(name)} failed: {exc}",
                            str(pairs[0][0])) from exc

    def mark_complete(self, name: str, local: Optional[Path], **meta: Any) -> None:
        """Write ``name``'s completion marker (rank 0, after every rank's upload); with the
        CRC32C of the sharded checkpoint's ``manifest.json`` at ``local``, when it has one."""
        doc = {"checkpoint": name, "saved_at": time.time(), **meta}
        manifest = None if local is None else local / MANIFEST_FILE
        if manifest is not None and manifest.is_file():
            doc["manifest_crc32c"] = f"{crc32c.crc32c(manifest.read_bytes()):08x}"
        self.fs.pipe_file(self._key(name) + COMPLETE_SUFFIX, json.dumps(doc).encode())

    def remove(self, name: str) -> None:
        """Delete checkpoint ``name``: its marker first (so it is never half listed), then
        its objects (missing is fine)."""
        for key, recursive in ((self._key(name) + COMPLETE_SUFFIX, False),
                               (self._key(name), True)):
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(key, recursive=recursive)
        self._refresh()

    def inspect_unmarked(self, name: str) -> tuple[Optional[dict[str, Any]], Optional[str]]:
        """Whether the objects of ``name``, which has no marker, are a complete checkpoint:
        downloaded into the stage and checked (every file against its checksums, which must
        be there, and its metadata readable). Returns ``(metadata, None)`` when complete (the
        verified copy stays in the stage, for a load), ``(None, why)`` when not.

        Raises:
            OSError: the store could not be read (nothing is concluded from that).
        """
        from cadence.checkpoint.checkpoint import read_metadata, verify

        try:
            local = self.download(name, require_marker=False)
        except (CheckpointError, FileNotFoundError) as exc:
            return None, str(exc)
        try:
            verify(local, require=True)
            return read_metadata(local), None
        except CheckpointError as exc:
            remove_checkpoint(local)
            return None, str(exc)

    def remove_unmarked(self, name: str, why: str) -> None:
        """Delete the objects of ``name``, which has no marker and failed its checks
        (``why``, from :meth:`inspect_unmarked`): a killed upload. Logged as a WARNING."""
        self._refresh()
        if self.marker(name) is None and self.fs.exists(self._key(name)):
            log.warning("Removing %s: it has no completion marker and fails its checks (%s), "
                        "so it is an upload that never finished; this run's save of that name "
                        "replaces it.", self.url_of(name), why)
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(self._key(name), recursive=True)
            self._refresh()

    def unmarked(self) -> list[str]:
        """Names of the checkpoint objects in the folder without a completion marker: a
        ``.pt`` file, or a directory holding DCP's ``.metadata``; not temporaries, not
        checkpoints set aside."""
        self._refresh()
        try:
            entries = self.fs.ls(self.root, detail=True)
        except FileNotFoundError:
            return []
        bases = {e["name"].rstrip("/").rsplit("/", 1)[-1]: e.get("type") for e in entries}
        found = []
        for base, kind in sorted(bases.items()):
            if (base.endswith(COMPLETE_SUFFIX) or base + COMPLETE_SUFFIX in bases
                    or TMP_MARK in base or is_aside(base)):
                continue
            if kind == "directory":
                if self.fs.exists(f"{self._key(base)}/{METADATA_FILE}"):
                    found.append(base)
            elif base.endswith(".pt"):
                found.append(base)
        return found

    def _modified(self, name: str) -> float:
        """When ``name`` was written (a directory: its ``.metadata``), as a POSIX time; now
        when the store does not say."""
        key = self._key(name)
        try:
            if self.fs.isdir(key):
                key = f"{key}/{METADATA_FILE}"
            info = self.fs.info(key)
        except OSError:
            return time.time()
        stamp = info.get("LastModified", info.get("mtime", info.get("created")))
        if hasattr(stamp, "timestamp"):
            return float(stamp.timestamp())
        return float(stamp) if isinstance(stamp, (int, float)) else time.time()

    def repair_markers(self, run_name: Optional[str]) -> list[str]:
        """Rewrite the marker of every unmarked checkpoint of ``run_name`` that passes its
        checks (:meth:`inspect_unmarked`; its ``saved_at`` is when the store says it was
        written); each is logged as a WARNING, and so is each unmarked checkpoint that fails
        (kept, not resumed from) or is another run's (left alone). Nothing is deleted.
        Rank 0, before resuming.

        Returns:
            The names whose markers were rewritten.

        Raises:
            OSError: the store could not be read or written.
        """
        repaired = []
        for name in self.unmarked():
            metadata, why = self.inspect_unmarked(name)
            if metadata is None:
                log.warning("%s has no completion marker and fails its checks (%s): taken for "
                            "an upload that did not finish; it is kept, but not resumed from.",
                            self.url_of(name), why)
                continue
            owner = metadata.get("run_name")
            if run_name is not None and owner != run_name:
                log.warning("%s has no completion marker; it passes its checksums but is run "
                            "%r's, not %r's: left as it is.", self.url_of(name), owner, run_name)
                continue
            local = self.stage / "loaded" / name
            self.mark_complete(name, local if local.is_dir() else None, run_name=owner,
                               format=metadata.get("format"), saved_at=self._modified(name),
                               repaired=True)
            log.warning("%s had no completion marker, but every file passes its checksums: it "
                        "is a complete checkpoint, and its marker was rewritten.",
                        self.url_of(name))
            repaired.append(name)
        return repaired

    # ------------------------------------------------------------------ reading
    def marker(self, name: str) -> Optional[dict[str, Any]]:
        """The completion marker of ``name`` (None when it has none: not complete)."""
        try:
            raw = self.fs.cat_file(self._key(name) + COMPLETE_SUFFIX)
        except FileNotFoundError:
            return None
        try:
            doc = json.loads(raw)
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None

    def markers(self) -> dict[str, dict[str, Any]]:
        """Every complete checkpoint in the folder: name -> its marker."""
        self._refresh()
        try:
            keys = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return {}
        found = {}
        for key in keys:
            base = key.rstrip("/").rsplit("/", 1)[-1]
            if base.endswith(COMPLETE_SUFFIX):
                name = base[:-len(COMPLETE_SUFFIX)]
                doc = self.marker(name)
                if doc is not None:
                    found[name] = doc
        return found

    def download(self, name: str, dest: Optional[Path] = None,
                 require_marker: bool = True) -> Path:
        """Download complete checkpoint ``name`` to ``dest`` (default the stage's
        ``loaded/<name>``) through a temporary, renamed when every file is there; an
        existing complete copy is reused (the load checks every file's CRC32C).
        ``require_marker=False``: download it without a marker (always afresh), for
        :meth:`inspect_unmarked` to check.

        Raises:
            CheckpointError: ``name`` has no completion marker (its upload did not finish),
                holds an object that is not a file of a checkpoint, or its
                ``manifest.json`` differs from the marker's CRC32C.
        """
        self._refresh()
        marker = self.marker(name)
        if marker is None and not require_marker:
            marker = {"saved_at": float("inf")}  # never reuse a staged copy
        if marker is None:
            raise CheckpointError(
                f"{self.url_of(name)} has no completion marker ({name}{COMPLETE_SUFFIX}): its "
                f"upload did not finish (or it was not written by cadence), so it is not "
                f"taken for a checkpoint. Load an earlier checkpoint.")
        dest = dest if dest is not None else self.stage / "loaded" / name
        if is_complete(dest) and dest.stat().st_mtime >= float(marker.get("saved_at", 0)):
            return dest
        key = self._key(name)
        tmp = dest.with_name(f"{dest.name}{TMP_MARK}download-{os.getpid()}")
        remove_checkpoint(tmp)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        if self.fs.isdir(key):
            files = [k for k in self.fs.find(key) if k != key]
            names = [_plain_name(k[len(key) + 1:], f"Checkpoint {self.url_of(name)}")
                     for k in files]
            tmp.mkdir()
            self.fs.get(files, [str(tmp / n) for n in names])
        else:
            self.fs.get_file(key, str(tmp))
        expected = marker.get("manifest_crc32c")
        if expected is not None:
            actual = f"{crc32c.crc32c((tmp / MANIFEST_FILE).read_bytes()):08x}"
            if actual != expected:
                remove_checkpoint(tmp)
                raise CheckpointError(
                    f"Checkpoint file {self.url_of(name)}/{MANIFEST_FILE} is corrupt: its "
                    f"CRC32C is {actual}, its completion marker says {expected}. Load an "
                    f"earlier checkpoint.")
        remove_checkpoint(dest)
        os.replace(tmp, dest)
        return dest

    # ------------------------------------------------------------------ the run's logs
    def upload_artifacts(self) -> None:
        """Upload the run's log files from the stage (``metrics.jsonl``, ``hparams.json``)
        to the folder, replacing the earlier copies (rank 0)."""
        files = sorted({p for pattern in _ARTIFACTS for p in self.stage.glob(pattern)
                        if p.is_file()})
        if files:
            self.fs.put([str(p) for p in files], [self._key(p.name) for p in files])

    def download_artifacts(self) -> None:
        """Copy the folder's log files into the stage, so a resumed run appends to them."""
        self._refresh()
        self.stage.mkdir(parents=True, exist_ok=True)
        try:
            keys = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return
        for key in keys:
            base = key.rstrip("/").rsplit("/", 1)[-1]
            if any(Path(base).match(pattern) for pattern in _ARTIFACTS):
                self.fs.get_file(key, str(self.stage / base))


@contextlib.contextmanager
def fetched(path: Union[str, Path]) -> Iterator[Path]:
    """A local copy of the checkpoint at ``path`` for loading (call on every rank): a
    remote one is downloaded by rank 0 and by the first rank of every other host, and
    removed afterwards; a local one is used where it is.

    Raises:
        CheckpointError: on every rank, when the download fails (:meth:`RemoteFolder.download`).
    """
    if not is_remote(path):
        yield local_path(path)
        return
    folder_url, name = split_url(str(path))
    folder = RemoteFolder(folder_url)
    dest = folder.stage / "loaded" / name
    error: Optional[str] = None
    if dist.get_global_rank() == 0:
        error = _try_download(folder, name, dest)
    dist.barrier()  # rank 0's host has it; other hosts fetch their own copy
    if dist.get_global_rank() != 0 and dist.get_local_rank() == 0 and not is_complete(dest):
        error = _try_download(folder, name, dest)
    errors = [e for e in dist.all_gather_object(error) if e is not None]
    if errors:
        raise CheckpointError(errors[0])
    try:
        yield dest
    finally:
        dist.barrier()
        if dist.get_local_rank() == 0:
            remove_checkpoint(dest)


@contextlib.contextmanager
def uploaded(target: Union[str, Path]) -> Iterator[Path]:
    """A local path to write ``target`` at: itself when local; for a URL, a temporary
    path whose file or directory is uploaded to ``target`` when the block succeeds.

    Raises:
        ValueError: as :func:`get_filesystem`.
    """
    if not is_remote(target):
        yield local_path(target)
        return
    import tempfile

    fs, key = get_filesystem(str(target))
    with tempfile.TemporaryDirectory(prefix="cadence-upload-") as tmp:
        local = Path(tmp) / key.rsplit("/", 1)[-1]
        yield local
        if local.is_dir():
            files = sorted(p for p in local.rglob("*") if p.is_file())
            fs.put([str(p) for p in files],
                   [f"{key}/{p.relative_to(local).as_posix()}" for p in files])
        else:
            fs.put_file(str(local), key)


def _try_download(folder: RemoteFolder, name: str, dest: Path) -> Optional[str]:
    try:
        folder.download(name, dest)
    except CheckpointError as exc:
        return str(exc)
    except (OSError, ValueError) as exc:  # network, permissions, a missing object
        return f"Cannot download checkpoint {folder.url_of(name)}: {type(exc).__name__}: {exc}"
    return None
