"""Checkpoint paths on disk: names, atomic writes, the ``latest`` pointer, and finding the
newest complete checkpoint.

A checkpoint is complete once it has its final name: it is written under a temporary name
in the same folder and renamed (``os.replace``, atomic on POSIX) only after every rank has
finished writing. The ``latest`` pointer is a small text file naming a checkpoint, itself
replaced atomically and only after the rename, so it never points at half a checkpoint.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Optional

__all__ = [
    "TMP_MARK", "EXTRA_FILE", "format_name", "is_complete", "atomic_write_bytes",
    "write_latest", "read_latest", "find_latest_checkpoint", "remove_checkpoint",
]

TMP_MARK = ".tmp-"  # in the name of anything still being written
EXTRA_FILE = "extra.pt"  # a sharded checkpoint's non-sharded part (rank 0 writes it)
METADATA_FILE = ".metadata"  # written by torch.distributed.checkpoint when a save completes


def format_name(template: str, *, run_name: str, epoch: int, batch: int, rank: int = 0) -> str:
    """Fill ``{run_name}``, ``{epoch}``, ``{batch}`` and ``{rank}`` in a checkpoint name.

    Raises:
        ValueError: the template has another field (the message lists the allowed ones).
    """
    try:
        return template.format(run_name=run_name, epoch=epoch, batch=batch, rank=rank)
    except (KeyError, IndexError) as exc:
        raise ValueError(
            f"save_filename {template!r} has an unknown field {exc}; allowed: {{run_name}}, "
            f"{{epoch}}, {{batch}}, {{rank}}."
        ) from None


def is_complete(path: Path) -> bool:
    """Whether ``path`` is a finished checkpoint: a full file, or a sharded directory with
    torch.distributed.checkpoint's metadata and cadence's extra file; never a temporary."""
    if TMP_MARK in path.name or not path.exists():
        return False
    if path.is_dir():
        return (path / METADATA_FILE).is_file() and (path / EXTRA_FILE).is_file()
    return path.is_file() and path.stat().st_size > 0


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + TMP_MARK, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_latest(folder: Path, latest_filename: str, checkpoint_name: str) -> None:
    """Point ``folder/latest_filename`` at ``checkpoint_name`` (atomically)."""
    atomic_write_bytes(folder / latest_filename, (checkpoint_name + "\n").encode())


def read_latest(folder: Path, latest_filename: str) -> Optional[Path]:
    """The checkpoint the pointer names, if the pointer exists and the checkpoint is complete."""
    pointer = folder / latest_filename
    if not pointer.is_file():
        return None
    target = folder / pointer.read_text().strip()
    return target if is_complete(target) else None


def find_latest_checkpoint(folder: Path, latest_filename: str,
                           belongs: Optional[Callable[[Path], bool]] = None) -> Optional[Path]:
    """The newest complete checkpoint in ``folder``: the one ``latest`` names, else the most
    recently modified complete one for which ``belongs(path)`` holds (e.g. written by this
    run); temporaries and partial directories are skipped."""
    if not folder.is_dir():
        return None
    pointed = read_latest(folder, latest_filename)
    if pointed is not None:
        return pointed
    candidates = [p for p in folder.iterdir()
                  if p.name != latest_filename and (p.is_dir() or p.suffix == ".pt")
                  and is_complete(p)]
    candidates.sort(key=lambda p: p.stat().st_mtime_ns, reverse=True)
    return next((p for p in candidates if belongs is None or belongs(p)), None)


def remove_checkpoint(path: Path) -> None:
    """Delete a checkpoint file or directory (missing is fine)."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
