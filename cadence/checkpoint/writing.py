"""Writing a checkpoint's files under their temporary name: hashed while written, with a
checksum manifest, and a failed save cleaned up and explained on every rank.

:func:`~cadence.checkpoint.checkpoint.save_checkpoint` calls :func:`write_full_file`
(rank 0) or :func:`write_sharded_dir` (every rank), then :func:`raise_if_save_failed` (every
rank), then renames the temporary into place. A failure on any rank (a full disk, an I/O
error, a bug) is shared with every rank through one collective, so no rank waits forever in a
barrier for a rank that gave up; the temporary is removed, and the error names the file being
written and the previous checkpoint, which is intact.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from cadence.utils import dist
from cadence.checkpoint.errors import CheckpointWriteError
from cadence.checkpoint.files import (
    EXTRA_FILE, MANIFEST_FILE, complete_checkpoints, is_complete, remove_checkpoint,
)
from cadence.checkpoint.layout import to_file
from cadence.checkpoint.manifest import (
    Digest, HashingFile, HashingFileSystemWriter, embed_checksum, write_manifest,
)

__all__ = ["find_os_error", "raise_if_save_failed", "save_failure_message",
           "write_extra_and_manifest", "write_full_file", "write_sharded_dir"]


def _torch_save_hashed(obj: Any, tmp: Path, hashing: bool = True,
                       embed: bool = False) -> HashingFile:
    """``torch.save(obj)`` to ``tmp`` through a :class:`HashingFile`, fsynced; with
    ``embed``, its size and CRC32C written into the file's zip comment. A write error is
    raised as the ``OSError`` it was (torch reports it as a zip ``unexpected pos``)."""
    with open(tmp, "wb") as f:
        out = HashingFile(f, tmp, hashing=hashing)
        try:
            torch.save(obj, out)
            f.flush()
            if embed:
                embed_checksum(f, out)
        except Exception:
            if out.error is not None:
                raise out.error from None
            raise
        os.fsync(f.fileno())
    return out


def write_full_file(obj: dict[str, Any], path: Path, tmp: Path, run_name: Optional[str],
                    checksums: bool = True) -> None:
    """Write a ``full`` checkpoint ``obj`` to ``tmp``, with ``checksums`` its size and
    CRC32C (computed while writing) in the file's zip comment. The caller renames ``tmp``
    to ``path``. ``obj`` is in cadence's flat layout (written in Composer's,
    :func:`~cadence.checkpoint.layout.to_file`) or already in Composer's (a ``state`` key).

    Raises:
        OSError: writing failed (``filename`` set to the file being written).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if "state" not in obj:
        obj = to_file(obj)
    _torch_save_hashed(obj, tmp, hashing=checksums, embed=checksums)


def write_sharded_dir(tensors: dict[str, Any], extra: dict[str, Any], tmp: Path,
                      run_name: Optional[str], checksums: bool = True) -> None:
    """Write a ``sharded`` checkpoint into the directory ``tmp`` (a collective): DCP writes
    each rank's shards and ``.metadata`` through a :class:`HashingFileSystemWriter`; rank 0
    gathers every rank's digests, writes ``extra.pt`` (hashed too) and, with ``checksums``,
    ``manifest.json``.

    Raises:
        OSError: writing failed on this rank (``filename`` set to the file being written).
        CheckpointException: DCP's save failed on some rank (its ``failures`` per rank).
    """
    tmp.mkdir(parents=True, exist_ok=True)
    writer = HashingFileSystemWriter(tmp, hashing=checksums)
    dcp.save(tensors, storage_writer=writer, no_dist=not dist.is_initialized())
    digests = dist.all_gather_object(writer.digests)
    if dist.get_global_rank() == 0:
        write_extra_and_manifest(extra, digests, tmp, run_name, checksums)


def write_extra_and_manifest(extra: dict[str, Any], digests: list[dict[str, Digest]],
                             tmp: Path, run_name: Optional[str], checksums: bool = True) -> None:
    """Rank 0's last part of a ``sharded`` save into ``tmp``: ``extra.pt`` (hashed while
    written) and, with ``checksums``, ``manifest.json`` listing every rank's ``digests``
    (file name -> (size, CRC32C), one dict per rank) and ``extra.pt``'s.

    Raises:
        OSError: writing failed (``filename`` set to the file being written).
    """
    merged = {name: digest for rank_digests in digests for name, digest in
              rank_digests.items()}
    extra_file = _torch_save_hashed(extra, tmp / EXTRA_FILE, hashing=checksums)
    merged[EXTRA_FILE] = extra_file.digest
    if checksums:
        write_manifest(tmp / MANIFEST_FILE, merged, run_name)


def find_os_error(exc: BaseException, depth: int = 0) -> Optional[OSError]:
    """The ``OSError`` behind ``exc``: itself, a DCP failure of some rank, or its cause."""
    if isinstance(exc, OSError):
        return exc
    if depth > 5:
        return None
    if isinstance(exc, CheckpointException):
        for _, (err, _) in sorted(exc.failures.items()):
            found = find_os_error(err, depth + 1)
            if found is not None:
                return found
    inner = exc.__cause__ or exc.__context__
    return None if inner is None else find_os_error(inner, depth + 1)


def _previous_checkpoint(path: Path) -> Optional[Path]:
    """The checkpoint a failed save of ``path`` leaves as the newest: ``path`` itself when
    it was being overwritten, else the newest complete one in its folder."""
    if is_complete(path):
        return path
    return max(complete_checkpoints(path.parent), key=lambda p: p.stat().st_mtime_ns,
               default=None)


def save_failure_message(exc: BaseException, tmp: Path, path: Path) -> Optional[str]:
    """What to tell the user when writing checkpoint ``path`` (under ``tmp``) failed with
    ``exc``: ``no space left on device while writing FILE; the previous checkpoint CKPT is
    intact``. None when ``exc`` is not an I/O error (a bug: its own traceback says more)."""
    os_error = find_os_error(exc)
    if os_error is None:
        return None
    if os_error.errno == errno.ENOSPC:
        reason = "no space left on device"
    else:
        reason = f"{os_error.strerror or os_error} (errno {os_error.errno})"
    written = os_error.filename or tmp
    previous = _previous_checkpoint(path)
    intact = (f"the previous checkpoint {previous} is intact" if previous is not None
              else f"no earlier checkpoint is in {path.parent}")
    return (f"{reason} while writing {written}; {intact}. The unfinished checkpoint {path.name} "
            f"was removed; free space (or fix the error) and resume.")


def raise_if_save_failed(failure: Optional[BaseException], tmp: Path, path: Path) -> None:
    """A collective: if writing failed on any rank, remove the temporary ``tmp`` and raise
    on every rank.

    Args:
        failure: this rank's exception while writing, or None.
        tmp: the temporary being written.
        path: the checkpoint's final path.

    Raises:
        CheckpointWriteError: writing failed with an ``OSError`` on some rank (the message
            names the file and the previous checkpoint; ``errno`` as the error's).
        Exception: this rank's ``failure`` itself, when it is not an I/O error.
    """
    mine = None if failure is None else (save_failure_message(failure, tmp, path)
                                         or f"{type(failure).__name__}: {str(failure)[:300]}")
    everyone = dist.all_gather_object(mine)
    failed = [(rank, message) for rank, message in enumerate(everyone) if message is not None]
    if not failed:
        return
    if dist.get_global_rank() == 0:
        remove_checkpoint(tmp)
    dist.barrier()  # the temporary is gone before any rank reports
    if failure is not None:
        os_error = find_os_error(failure)
        if os_error is None:
            raise failure
        error = CheckpointWriteError(mine)
        error.errno = os_error.errno
        raise error from failure
    rank, message = failed[0]
    raise CheckpointWriteError(f"rank {rank}: {message}")
