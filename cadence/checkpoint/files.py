"""Checkpoint paths on disk: names, atomic writes, the ``latest`` pointer, finding the
newest complete checkpoint, and removing a run's stale temporaries.

A checkpoint is complete once it has its final name: it is written under a temporary name
in the same folder and renamed (``os.replace``, atomic on POSIX) only after every rank has
finished writing. The ``latest`` pointer is a small text file naming a checkpoint, itself
replaced atomically and only after the rename, so it never points at half a checkpoint. The
pointer is only ever resolved inside its own folder.

Temporaries are named ``<final name>.tmp-<run tag>-<random>``, the run tag being a hash of
the run's name (:func:`run_tag`), so a starting run can tell its own stale temporaries
(from a killed save) from another run's and removes only its own
(:func:`remove_stale_temporaries`).

Checkpoints set aside are never candidates: one autoresume rejected (it failed its checksums
and the run fell back to an earlier one) is renamed ``<name>.rejected-<time>``
(:func:`move_aside`), and a state with NaN/inf values is written as ``<name>.nonfinite``
(:mod:`~cadence.checkpoint.finite`); both stay for a person to inspect, neither is deleted.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

from cadence.checkpoint.errors import CheckpointError

__all__ = [
    "DEFAULT_FILENAME", "DEFAULT_LATEST", "DEFAULT_POINTER", "name_template",
    "pointer_template", "TMP_MARK", "EXTRA_FILE", "METADATA_FILE", "MANIFEST_FILE",
    "NONFINITE_SUFFIX",
    "REJECTED_MARK", "format_name", "is_aside", "is_complete", "move_aside",
    "not_a_checkpoint_folder",
    "atomic_write_bytes", "manifest_path", "run_tag",
    "temporary_path", "write_latest", "read_latest", "checkpoint_candidates",
    "find_latest_checkpoint", "remove_checkpoint", "remove_stale_temporaries",
]

TMP_MARK = ".tmp-"  # in the name of anything still being written
EXTRA_FILE = "extra.pt"  # a sharded checkpoint's non-sharded part (rank 0 writes it)
METADATA_FILE = ".metadata"  # written by torch.distributed.checkpoint when a save completes
MANIFEST_FILE = "manifest.json"  # a sharded checkpoint's checksums, inside its directory
REJECTED_MARK = ".rejected-"  # <name>.rejected-<time>: autoresume rejected it, kept aside
NONFINITE_SUFFIX = ".nonfinite"  # <name>.nonfinite: a state with NaN/inf, kept for debugging

log = logging.getLogger(__name__)


def run_tag(run_name: str) -> str:
    """8 hex digits identifying ``run_name`` in the names of its temporaries."""
    return hashlib.sha1(run_name.encode()).hexdigest()[:8]


def temporary_path(path: Path, run_name: str, token: Optional[str] = None) -> Path:
    """Where ``path`` is written before its rename: ``<name>.tmp-<run tag>-<token>`` (pass
    the same ``token`` on every rank; a random one by default)."""
    token = token if token is not None else secrets.token_hex(4)
    return path.with_name(f"{path.name}{TMP_MARK}{run_tag(run_name)}-{token}")


def manifest_path(checkpoint: Path) -> Path:
    """The checksum manifest of the sharded checkpoint directory ``checkpoint`` (a full
    file carries its checksum inside, see :mod:`~cadence.checkpoint.manifest`)."""
    return checkpoint / MANIFEST_FILE


def format_name(template: str, *, run_name: str, epoch: int, batch: int, rank: int = 0) -> str:
    """Fill ``{run_name}``, ``{epoch}``, ``{batch}`` and ``{rank}`` in a checkpoint name.

    Raises:
        ValueError: the template has another field (the message lists the allowed ones).
    """
    try:
        return template.format(run_name=run_name, epoch=int(epoch), batch=int(batch),
                               rank=int(rank))
    except (KeyError, IndexError) as exc:
        raise ValueError(
            f"save_filename {template!r} has an unknown field {exc}; allowed: {{run_name}}, "
            f"{{epoch}}, {{batch}}, {{rank}}."
        ) from None


#: Composer's default names: a full checkpoint ``ep{epoch}-ba{batch}-rank{rank}.pt`` (rank 0
#: writes it), a sharded one the folder ``ep{epoch}-ba{batch}`` (every rank writes its shard
#: in it), the symlink to the newest ``latest-rank{rank}.pt``.
DEFAULT_FILENAME = "ep{epoch}-ba{batch}-rank{rank}.pt"
DEFAULT_LATEST = "latest-rank{rank}.pt"
DEFAULT_POINTER = "latest-{run_name}"  # cadence's pointer file, beside Composer's symlink


def name_template(filename: str, fmt: str) -> str:
    """The checkpoint name template for format ``fmt``: a ``full`` checkpoint is a ``.pt``
    file (appended when missing); a ``sharded`` one is a folder, named as Composer names it:
    the template without ``.pt`` and without ``-rank{rank}`` (every rank writes into it), so
    the default gives ``ep{epoch}-ba{batch}``."""
    if fmt == "full":
        return filename if filename.endswith(".pt") else filename + ".pt"
    name = filename[:-len(".pt")] if filename.endswith(".pt") else filename
    return name.replace("-rank{rank}", "")


def pointer_template(latest_filename: Optional[str]) -> str:
    """The name template of cadence's ``latest`` pointer file for ``latest_filename`` (a
    Trainer's ``save_latest_filename``): a name ending in ``.pt`` (Composer's
    ``latest-rank{rank}.pt``) is the symlink's, and the pointer keeps its own name
    ``latest-{run_name}``; None (Composer: no symlink) likewise."""
    if latest_filename is None or latest_filename.endswith(".pt"):
        return DEFAULT_POINTER
    return latest_filename


def is_complete(path: Path) -> bool:
    """Whether ``path`` is a finished checkpoint: a full file, or a sharded directory with
    torch.distributed.checkpoint's metadata and cadence's extra file; never a temporary."""
    if TMP_MARK in path.name or not path.exists():
        return False
    if path.is_dir():
        return (path / METADATA_FILE).is_file() and (path / EXTRA_FILE).is_file()
    return path.is_file() and path.stat().st_size > 0


def is_aside(path: Path) -> bool:
    """Whether ``path`` was set aside (``*.rejected-<time>``, ``*.nonfinite``): never listed,
    pointed at or resumed from."""
    return REJECTED_MARK in path.name or path.name.endswith(NONFINITE_SUFFIX)


def move_aside(path: Path) -> Path:
    """Rename the checkpoint at ``path`` to ``<name>.rejected-<UTC time>`` in its folder (never
    deleting it), so no later save collides with it and no finder takes it again. Returns the
    new path.

    Raises:
        OSError: the rename failed (e.g. a read-only folder).
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}{REJECTED_MARK}{stamp}")
    count = 1
    while target.exists() or target.is_symlink():
        count += 1
        target = path.with_name(f"{path.name}{REJECTED_MARK}{stamp}-{count}")
    os.replace(path, target)
    return target


def not_a_checkpoint_folder(folder: Path) -> Optional[str]:
    """Why the directory ``folder``, given as ``load_path``, is not a checkpoint (a run's save
    folder, or a folder without DCP's ``.metadata``), naming a checkpoint in it when there is
    one; None when it is a sharded checkpoint (complete or not: loading reports the rest)."""
    if (folder / METADATA_FILE).is_file() or (folder / EXTRA_FILE).is_file():
        return None
    inside = sorted((p for p in folder.iterdir() if TMP_MARK not in p.name and not is_aside(p)
                     and not p.is_symlink()  # Composer's latest-rank0.pt names a real one
                     and (p.suffix == ".pt" or (p / METADATA_FILE).is_file())),
                    key=lambda p: p.stat().st_mtime_ns)
    if inside:
        return (f"{str(folder)!r} is a folder of checkpoints (a run's save folder), not a "
                f"checkpoint; give one of them, e.g. load_path: {inside[-1]} (the newest), or "
                f"to continue that run set save_folder to it with autoresume: true.")
    return (f"{str(folder)!r} is a folder without a checkpoint in it (no .metadata, so not a "
            f"sharded checkpoint); give the path of a .pt file or of a sharded checkpoint "
            f"folder.")


def atomic_write_bytes(path: Path, data: bytes, run_name: Optional[str] = None) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder, then rename
    (with ``run_name``, the temporary carries its :func:`run_tag`). A failed write removes
    its temporary."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tag = f"{run_tag(run_name)}-" if run_name is not None else ""
    fd, tmp = tempfile.mkstemp(prefix=f"{path.name}{TMP_MARK}{tag}", dir=path.parent)
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


def _pointed_name(pointer: Path) -> Path:
    """The checkpoint path that ``pointer`` names, relative to its folder.

    Raises:
        CheckpointError: the pointer holds binary data or an empty name, or names something
            outside its folder (an absolute path, ``..``, a symlink leading out).
    """
    raw = pointer.read_bytes()
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        text = None
    if not text or any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        what = "is empty" if text == "" else f"holds binary data ({raw[:16]!r}...)"
        raise CheckpointError(
            f"The latest pointer {pointer} {what}, not the name of a checkpoint in its folder. "
            f"Delete it: autoresume then picks the newest complete checkpoint of the run.")
    name = Path(text)
    folder = pointer.parent
    inside = not name.is_absolute() and ".." not in name.parts
    if inside:
        try:
            (folder / name).resolve().relative_to(folder.resolve())
        except ValueError:
            inside = False  # a symlink leading out of the folder
    if not inside:
        raise CheckpointError(
            f"The latest pointer {pointer} names {text!r}, which is outside its folder "
            f"{folder}; a pointer may only name a checkpoint inside its own folder. Delete "
            f"the pointer (autoresume then picks the newest complete checkpoint of the run), "
            f"or pass the checkpoint you mean as load_path.")
    return name


def read_latest(folder: Path, latest_filename: str) -> Optional[Path]:
    """The checkpoint the pointer names, if the pointer exists and the checkpoint is complete.

    Raises:
        CheckpointError: the pointer holds garbage or names a path outside ``folder``.
    """
    pointer = folder / latest_filename
    if not pointer.is_file():
        return None
    name = _pointed_name(pointer)
    target = folder / name
    if is_complete(target) and str(name) not in ("", ".") and not is_aside(target):
        return target
    what = ("does not exist" if not target.exists() else
            "is its own folder" if str(name) in ("", ".") else
            "was set aside" if is_aside(target) else "is not a complete checkpoint")
    log.warning("The latest pointer %s holds %r, which %s; it is ignored, and the newest "
                "complete checkpoint of the run in %s is used instead (if any).", pointer,
                str(name), what, folder)
    return None


def checkpoint_candidates(folder: Path, latest_filename: str,
                          belongs: Optional[Callable[[Path], bool]] = None) -> Iterator[Path]:
    """Complete checkpoints in ``folder``, newest first: the one ``latest`` names, then the
    others for which ``belongs(path)`` holds, most recently modified first (lazily: a
    consumer that stops at the first pays for one). Temporaries, partial directories and
    symlinks (Composer's ``latest-rank0.pt``) are skipped.

    Raises:
        CheckpointError: the ``latest`` pointer holds garbage or names a path outside
            ``folder`` (see :func:`read_latest`).
    """
    if not folder.is_dir():
        return
    pointed = read_latest(folder, latest_filename)
    if pointed is not None:
        yield pointed
    candidates = [p for p in folder.iterdir()
                  if p.name != latest_filename and not p.is_symlink()  # latest-rank0.pt
                  and (p.is_dir() or p.suffix == ".pt") and not is_aside(p)
                  and p != pointed and is_complete(p)]
    candidates.sort(key=lambda p: p.stat().st_mtime_ns, reverse=True)
    yield from (p for p in candidates if belongs is None or belongs(p))


def find_latest_checkpoint(folder: Path, latest_filename: str,
                           belongs: Optional[Callable[[Path], bool]] = None) -> Optional[Path]:
    """The newest complete checkpoint in ``folder``: the one ``latest`` names, else the most
    recently modified complete one for which ``belongs(path)`` holds (e.g. written by this
    run); temporaries and partial directories are skipped.

    Raises:
        CheckpointError: the ``latest`` pointer holds garbage or names a path outside
            ``folder`` (see :func:`read_latest`).
    """
    return next(checkpoint_candidates(folder, latest_filename, belongs), None)


def remove_checkpoint(path: Path) -> None:
    """Delete a checkpoint or a temporary, file or directory (missing is fine). A symlink is
    removed itself, never followed: the checkpoint it points to stays."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def remove_stale_temporaries(folder: Path, run_name: str, latest_filename: str) -> list[Path]:
    """Remove run ``run_name``'s temporaries left in ``folder`` by saves that were killed:
    those whose name carries the run's :func:`run_tag`, temporaries of the run's ``latest``
    pointer, and symlink temporaries (``latest-rank0.pt.tmp-<hex>``, from a save killed while
    moving Composer's symlink: removing a symlink never removes what it points to). Another
    run's temporaries (another tag) are left alone. Call when the
    run starts, before it saves (the run-folder lock keeps a second live run of the same name
    out of the folder).

    Returns:
        The paths removed.
    """
    if not folder.is_dir():
        return []
    own = f"{TMP_MARK}{run_tag(run_name)}-"
    removed = []
    for path in folder.iterdir():
        if (own in path.name or path.name.startswith(latest_filename + TMP_MARK)
                or (path.is_symlink() and TMP_MARK in path.name)):
            remove_checkpoint(path)
            removed.append(path)
    return sorted(removed)
