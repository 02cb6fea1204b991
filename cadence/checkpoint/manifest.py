"""Per-file CRC32C checksums of a checkpoint: computed while it is written, checked before
it is used.

Every file of a checkpoint has its size in bytes and CRC32C (``crc32c`` package,
hardware-accelerated) recorded at save time:

- ``full``: inside the file itself, as the zip comment that closes every ``torch.save`` file
  (``cadence-crc32c:<size>:<crc>``; zip readers, ``torch.load`` included, skip it), so the
  checkpoint stays one file that can be copied or renamed with its checksum. The CRC covers
  the file as ``torch.save`` wrote it (comment length 0).
- ``sharded``: ``manifest.json`` in the directory, listing every ``.distcp`` shard,
  ``.metadata`` and ``extra.pt``::

    {"algorithm": "crc32c", "files": {"__0_0.distcp": {"bytes": 1234, "crc32c": "1a2b3c4d"}}}

Hashing happens while writing, not by reading the files back: ``torch.save`` writes through
:class:`HashingFile`, and DCP writes its shards and ``.metadata`` through
:class:`HashingFileSystemWriter`, a ``FileSystemWriter`` whose file system wraps every stream
it opens for writing in a :class:`HashingFile` (each rank hashes the files it writes; rank 0
gathers the digests and writes the manifest). The checksums are on disk before the checkpoint
is renamed into place, so a complete checkpoint always has them.

Verifying (:func:`verify_checkpoint`) reads each file once and compares its size and CRC32C;
a mismatch raises :class:`~cadence.checkpoint.errors.CheckpointError` naming the file.
A file verified earlier in the same process and unchanged since (same size, mtime and inode)
is not read again, so autoresume's verification and the load that follows cost one read.

:class:`HashingFile` also keeps the ``OSError`` a write raised (``torch.save``'s C++ writer
replaces it with a zip ``unexpected pos`` error), so a failed save can say why it failed.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
import threading
from pathlib import Path
from typing import IO, Any, Iterator, Mapping, Optional

import crc32c
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from cadence.checkpoint.errors import CheckpointError
from cadence.checkpoint.files import atomic_write_bytes, manifest_path

__all__ = ["ALGORITHM", "Digest", "HashingFile", "HashingFileSystemWriter", "embed_checksum",
           "embedded_checksum", "file_crc32c", "read_manifest", "verify_checkpoint",
           "write_manifest"]

ALGORITHM = "crc32c"
Digest = tuple[int, int]  # (size in bytes, CRC32C)
_CHUNK = 64 * 2**20  # bytes hashed at a time when verifying
_EOCD = b"PK\x05\x06"  # a zip's end-of-central-directory record: 22 bytes + the comment
_EOCD_SIZE = 22
_COMMENT = b"cadence-crc32c:"

# str(file) -> (size, mtime_ns, inode, crc) of files that passed in this process
_verified: dict[str, tuple[int, int, int, int]] = {}


def _naming(exc: OSError, path: Path) -> OSError:
    """``exc`` with its ``filename`` set to ``path`` when it has none."""
    if exc.filename is not None:
        return exc
    return type(exc)(exc.errno, exc.strerror or str(exc), str(path))


class HashingFile:
    """A write-only file object over ``raw`` that keeps the size and CRC32C of everything
    written through it (``torch.save``, ``pickle.dump`` and DCP's writers call ``write``;
    ``tell``, ``flush``, ``fileno`` and ``close`` pass through).

    Attributes:
        name: the file's path (for messages).
        size: bytes written so far.
        crc: CRC32C of those bytes (0 when created with ``hashing=False``).
        error: the ``OSError`` a write raised (e.g. ENOSPC), else None.
    """

    def __init__(self, raw: IO[bytes], name: Path, hashing: bool = True) -> None:
        self.raw, self.name, self.hashing = raw, Path(name), hashing
        self.size, self.crc = 0, 0
        self.tail = b""  # the last bytes written (a zip's end record)
        self.error: Optional[OSError] = None

    def write(self, data: Any) -> int:
        try:
            written = self.raw.write(data)
        except OSError as exc:
            self.error = _naming(exc, self.name)
            raise
        view = memoryview(data).cast("B")
        if self.hashing:
            self.crc = crc32c.crc32c(view, self.crc)
        self.size += view.nbytes
        self.tail = (self.tail + bytes(view[-_EOCD_SIZE:]))[-_EOCD_SIZE:]
        return view.nbytes if written is None else written

    def tell(self) -> int:
        return self.raw.tell()

    def flush(self) -> None:
        self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        self.raw.close()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    @property
    def digest(self) -> Digest:
        return self.size, self.crc


class _HashingFileSystem(FileSystem):
    """DCP's local file system, hashing every stream opened for writing (thread-safe: DCP
    may write with several threads). ``digests`` maps file name -> (size, CRC32C). A write
    error is raised as the ``OSError`` it was, naming its file."""

    def __init__(self, hashing: bool = True) -> None:
        super().__init__()
        self.hashing = hashing
        self.digests: dict[str, Digest] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        hashing: Optional[HashingFile] = None
        try:
            with super().create_stream(path, mode) as raw:
                hashing = HashingFile(raw, Path(path), self.hashing)
                yield hashing
        except OSError as exc:  # opening, writing, flushing or closing
            raise _naming(exc, Path(path)) from None
        except Exception:
            if hashing is not None and hashing.error is not None:
                raise hashing.error from None  # not torch.save's "unexpected pos"
            raise
        with self._lock:
            self.digests[Path(path).name] = hashing.digest

    def rename(self, path: Any, new_path: Any) -> None:
        super().rename(path, new_path)  # DCP writes .metadata.tmp, then renames it
        with self._lock:
            if Path(path).name in self.digests:
                self.digests[Path(new_path).name] = self.digests.pop(Path(path).name)


class HashingFileSystemWriter(FileSystemWriter):
    """``torch.distributed.checkpoint.FileSystemWriter`` that hashes, while writing, every
    file it writes on this rank (its ``.distcp`` shards; on the coordinator also
    ``.metadata``).

    Args:
        path: the checkpoint directory.
        hashing: compute the CRC32Cs (``False`` keeps only the write-error reporting).
        kwargs: ``FileSystemWriter``'s.

    Attributes:
        digests: file name -> (size in bytes, CRC32C), filled as files are closed.

    Raises (from ``write_data``):
        OSError: a write failed (``filename``: the file), not torch's zip error.
    """

    def __init__(self, path: str | os.PathLike[str], hashing: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.fs: _HashingFileSystem = _HashingFileSystem(hashing)

    @property
    def digests(self) -> dict[str, Digest]:
        return dict(self.fs.digests)


def embed_checksum(f: IO[bytes], written: HashingFile) -> None:
    """Write ``written``'s size and CRC32C into the zip comment of the ``torch.save`` file
    ``f`` (open for writing, positioned at its end): the end record's comment length, its
    last 2 bytes, is overwritten, and the comment appended.

    Raises:
        ValueError: the file does not end with a comment-less zip end record (not written by
            ``torch.save``).
    """
    if written.tail[:4] != _EOCD or written.tail[-2:] != b"\x00\x00":
        raise ValueError(f"{written.name} does not end as a torch.save file does; no checksum.")
    comment = _COMMENT + f"{written.size}:{written.crc:08x}".encode()
    f.seek(written.size - 2)
    f.write(struct.pack("<H", len(comment)) + comment)
    f.flush()


def embedded_checksum(path: Path) -> Optional[Digest]:
    """The ``(size, CRC32C)`` that :func:`embed_checksum` wrote into the full checkpoint at
    ``path``; None if it has none (written before cadence had checksums).

    Raises:
        CheckpointError: the file does not end with a zip end record (truncated), or ends
            with a cadence checksum that cannot be parsed.
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(0, size - 128))
        end = f.read()
    at = end.rfind(_COMMENT)
    if at < _EOCD_SIZE or end[at - _EOCD_SIZE:at - _EOCD_SIZE + 4] != _EOCD:
        if end[-_EOCD_SIZE:-_EOCD_SIZE + 4] == _EOCD:
            return None  # a complete zip without a comment: written before checksums
        raise CheckpointError(f"Checkpoint file {path} is truncated or corrupt: it does not end "
                              f"with a zip end record. Load an earlier checkpoint.")
    comment = end[at:]
    try:
        (length,) = struct.unpack("<H", end[at - 2:at])
        written, crc = comment[len(_COMMENT):].decode().split(":")
        if length != len(comment):
            raise ValueError(f"comment length {length}, {len(comment)} bytes follow")
        return int(written), int(crc, 16)
    except ValueError as exc:
        raise CheckpointError(f"Checkpoint file {path} is truncated or corrupt: its checksum "
                              f"({comment[:60]!r}) cannot be read ({exc}). Load an earlier "
                              f"checkpoint.") from None


def write_manifest(path: Path, digests: Mapping[str, Digest],
                   run_name: Optional[str] = None) -> None:
    """Write the manifest of ``digests`` (file name -> (size, CRC32C)) to ``path``,
    atomically (its temporary carries ``run_name``'s tag)."""
    doc = {"algorithm": ALGORITHM,
           "files": {name: {"bytes": size, ALGORITHM: f"{crc:08x}"}
                     for name, (size, crc) in sorted(digests.items())}}
    atomic_write_bytes(path, (json.dumps(doc, indent=1) + "\n").encode(), run_name=run_name)


def read_manifest(path: Path) -> Optional[dict[str, Digest]]:
    """The manifest at ``path`` as file name -> (size, CRC32C); None if there is none.

    Raises:
        CheckpointError: the manifest exists but is not one (names it).
    """
    try:
        doc = json.loads(path.read_bytes())
        if doc["algorithm"] != ALGORITHM:
            raise ValueError(f"algorithm {doc['algorithm']!r}, expected {ALGORITHM!r}")
        return {str(name): (int(entry["bytes"]), int(entry[ALGORITHM], 16))
                for name, entry in doc["files"].items()}
    except FileNotFoundError:
        return None
    except Exception as exc:  # not JSON, not UTF-8, missing keys, bad numbers
        raise CheckpointError(
            f"The checksum manifest {path} cannot be read ({type(exc).__name__}: "
            f"{str(exc)[:200]}): it is corrupt, so its checkpoint cannot be verified. Load an "
            f"earlier checkpoint.") from None


def file_crc32c(path: Path, limit: Optional[int] = None) -> Digest:
    """Size and CRC32C of the file at ``path`` (of its first ``limit`` bytes). The file is
    memory-mapped and hashed in 64 MiB pieces: from the page cache this reads each byte once,
    without copying it (about 3x faster than ``readinto`` a buffer)."""
    size = path.stat().st_size if limit is None else min(limit, path.stat().st_size)
    if size == 0:
        return 0, 0
    crc = 0
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mapped:
        mapped.madvise(mmap.MADV_SEQUENTIAL)
        view = memoryview(mapped)
        try:
            for start in range(0, size, _CHUNK):
                crc = crc32c.crc32c(view[start:min(start + _CHUNK, size)], crc)
        finally:
            view.release()
    return size, crc


def _verify_file(file: Path, expected: Digest, source: str, full: bool = False) -> None:
    """Check ``file`` against ``expected`` (from ``source``, for the message). A ``full``
    file is hashed as ``torch.save`` wrote it: up to its zip comment, comment length 0."""
    size, crc = expected
    try:
        st = file.stat()
    except FileNotFoundError:
        raise CheckpointError(
            f"FileNotFoundError: checkpoint file {file}, listed in {source}, does not exist. "
            f"Load an earlier checkpoint.") from None
    stamp = (st.st_size, st.st_mtime_ns, st.st_ino, crc)
    if _verified.get(str(file)) == stamp:
        return
    on_disk = st.st_size
    if full:  # the comment follows the hashed bytes
        on_disk -= len(_COMMENT) + len(f"{size}:{crc:08x}")
    if on_disk != size:
        raise CheckpointError(
            f"Checkpoint file {file} is truncated or corrupt: it has {on_disk} bytes, {source} "
            f"says {size}. Load an earlier checkpoint.")
    if full:
        actual = crc32c.crc32c(b"\x00\x00", file_crc32c(file, limit=size - 2)[1])
    else:
        actual = file_crc32c(file)[1]
    if actual != crc:
        raise CheckpointError(
            f"Checkpoint file {file} is corrupt: its CRC32C is {actual:08x}, {source} says "
            f"{crc:08x} (it changed after it was written: a disk, network or copy error). "
            f"Load an earlier checkpoint.")
    _verified[str(file)] = stamp


def verify_checkpoint(checkpoint: Path, part: tuple[int, int] = (0, 1)) -> bool:
    """Check the files of ``checkpoint`` against the checksums written with it.

    Args:
        checkpoint: a full ``.pt`` file or a sharded directory.
        part: ``(index, count)``: of a sharded checkpoint's files, verify every ``count``-th
            from ``index`` (ranks split the files this way); default all.

    Returns:
        False if the checkpoint has no checksums (nothing was verified), else True.

    Raises:
        CheckpointError: a file is missing, or has another size or another CRC32C than
            recorded, or the manifest is corrupt (each message names the file).
    """
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        expected = embedded_checksum(checkpoint)
        if expected is None:
            return False
        if part[0] == 0:
            _verify_file(checkpoint, expected, "the checksum in its zip comment", full=True)
        return True
    manifest = manifest_path(checkpoint)
    entries = read_manifest(manifest)
    if entries is None:
        return False
    bad = [n for n in entries if Path(n).name != n or n in ("", ".", "..")]
    if bad:
        raise CheckpointError(f"The checksum manifest {manifest} lists {bad[0]!r}, which is "
                              f"not a file of its checkpoint directory.")
    index, count = part
    for name, digest in sorted(entries.items())[index::count]:
        _verify_file(checkpoint / name, digest, f"its manifest {manifest}")
    return True
