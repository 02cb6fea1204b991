"""Checkpoint names and paths on disk: the name templates (:func:`format_name` is the one
place a checkpoint name is filled in), completeness, atomic writes, and removing a run's
stale temporaries. The local checkpoint folder (the ``latest`` pointer, candidates,
setting aside) is :class:`~cadence.checkpoint.store.LocalFolder`.

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
(:meth:`~cadence.checkpoint.store.CheckpointStore.move_aside`), and a state with NaN/inf
values is written as ``<name>.nonfinite`` (:mod:`~cadence.checkpoint.finite`); both stay
for a person to inspect, neither is deleted.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Optional, Union


__all__ = [
    "DEFAULT_FILENAME", "DEFAULT_LATEST", "DEFAULT_POINTER", "EXTRA_FILE",
    "MANIFEST_FILE", "METADATA_FILE", "NONFINITE_SUFFIX", "REJECTED_MARK", "TMP_MARK",
    "atomic_write_bytes", "complete_checkpoints", "could_write", "format_name", "is_aside",
    "is_complete", "manifest_path", "name_template", "not_a_checkpoint_folder",
    "pointer_name", "pointer_template", "remove_checkpoint", "remove_stale_temporaries",
    "run_tag", "temporary_path",
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


_SAMPLE = {"epoch": 918273645, "batch": 546372819, "rank": 192837465}  # for could_write


def could_write(filename: str, run_name: str, name: str) -> bool:
    """Whether ``filename`` (a ``save_filename`` template) yields ``name`` (a checkpoint's file
    or directory name, ``.pt`` optional) for run ``run_name`` at some epoch, batch and rank."""
    try:
        sample = format_name(filename, run_name=run_name, **_SAMPLE)
    except ValueError:
        return False  # a bad template is reported by the CheckpointSaver
    pattern = re.escape(sample)
    for value in _SAMPLE.values():
        pattern = pattern.replace(str(value), r"\d+")
    return re.fullmatch(pattern + r"(\.pt)?", name) is not None


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


def pointer_name(latest_filename: Optional[str], run_name: str) -> str:
    """The name of run ``run_name``'s ``latest`` pointer in its folder for
    ``latest_filename`` (a ``save_latest_filename``, or a pointer template): by default
    ``latest-{run_name}`` filled in (:func:`pointer_template`)."""
    return pointer_template(latest_filename).format(run_name=run_name)


def is_complete(path: Path) -> bool:
    """Whether ``path`` is a finished checkpoint: a full file, or a sharded directory with
    torch.distributed.checkpoint's metadata and cadence's extra file; never a temporary."""
    if TMP_MARK in path.name or not path.exists():
        return False
    if path.is_dir():
        return (path / METADATA_FILE).is_file() and (path / EXTRA_FILE).is_file()
    return path.is_file() and path.stat().st_size > 0


def complete_checkpoints(folder: Path) -> list[Path]:
    """The complete checkpoints in ``folder`` not set aside (no symlink: Composer's
    ``latest-rank0.pt`` names a real one), in no order; none when it does not exist."""
    if not folder.is_dir():
        return []
    return [p for p in folder.iterdir() if not p.is_symlink()
            and (p.is_dir() or p.suffix == ".pt") and not is_aside(p) and is_complete(p)]


def is_aside(path: Union[str, Path]) -> bool:
    """Whether the checkpoint named ``path`` was set aside (``*.rejected-<time>``,
    ``*.nonfinite``): never listed, pointed at or resumed from."""
    name = Path(path).name
    return REJECTED_MARK in name or name.endswith(NONFINITE_SUFFIX)


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
