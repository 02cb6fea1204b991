"""Checks at start that an autoresumed run can resume: its save folder must not hold another
run's checkpoints under the names this run would write.

Autoresume continues the newest checkpoint *of its own run* (by the ``run_name`` in each
checkpoint's metadata). When a folder holds none of this run's but another run's, whose
names this run's ``save_filename`` would produce again (``ep0-ba100.pt``), the run would
train from scratch and then fail at its first save, or with ``save_overwrite`` destroy the
other run's checkpoints. This module refuses that at start, naming the other run and the fix.
Folders holding several runs whose names cannot collide (``save_filename`` with
``{run_name}``) are fine.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from cadence.utils import dist
from cadence.checkpoint.remote import is_remote, local_path

__all__ = ["check_autoresume_folder", "could_write"]

_SENTINELS = {"epoch": 918273645, "batch": 546372819, "rank": 192837465}


def could_write(filename: str, run_name: str, name: str) -> bool:
    """Whether ``filename`` (a ``save_filename`` template) yields ``name`` (a checkpoint's file
    or directory name, ``.pt`` optional) for run ``run_name`` at some epoch, batch and rank."""
    try:
        sample = filename.format(run_name=run_name, **_SENTINELS)
    except (KeyError, IndexError, ValueError):
        return False  # a bad template is reported by the CheckpointSaver
    pattern = re.escape(sample)
    for value in _SENTINELS.values():
        pattern = pattern.replace(str(value), r"\d+")
    return re.fullmatch(pattern + r"(\.pt)?", name) is not None


def _foreign_checkpoints(folder: Path, run_name: str, filename: str) -> dict[str, Path]:
    """Another run's name -> one of its checkpoints in ``folder`` whose name this run could
    write; empty when ``folder`` holds a checkpoint of ``run_name`` (autoresume takes it)."""
    from cadence.checkpoint.checkpoint import CheckpointError, read_metadata
    from cadence.checkpoint.files import is_complete

    if not folder.is_dir():
        return {}
    others: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        if not (path.is_dir() or path.suffix == ".pt") or not is_complete(path):
            continue
        try:
            owner = read_metadata(path).get("run_name")
        except CheckpointError:
            continue  # not a checkpoint, or a broken one: autoresume reports those
        if owner == run_name:
            return {}
        if could_write(filename, run_name, path.name):
            others.setdefault(str(owner), path)
    return others


def _foreign_remote_checkpoints(url: str, run_name: str, filename: str) -> dict[str, Path]:
    """:func:`_foreign_checkpoints` of a remote folder, from its completion markers."""
    from cadence.checkpoint.remote import RemoteFolder

    others: dict[str, Path] = {}
    for name, marker in sorted(RemoteFolder(url).markers().items()):
        owner = marker.get("run_name")
        if owner == run_name:
            return {}
        if could_write(filename, run_name, name):
            others.setdefault(str(owner), Path(name))
    return others


def check_autoresume_folder(folder: Optional[str], run_name: str, filename: str) -> None:
    """Refuse an autoresume into ``folder`` that holds no checkpoint of ``run_name`` but another
    run's, under names this run would write. Rank 0 looks; every rank raises.

    Raises:
        ValueError: naming the other run(s), one of their checkpoints, and the fixes.
    """
    if folder is None:
        return
    message: list[Optional[str]] = [None]
    if dist.get_global_rank() == 0:
        others = (_foreign_remote_checkpoints(folder, run_name, filename) if is_remote(folder)
                  else _foreign_checkpoints(local_path(folder), run_name, filename))
        if others:
            owner, example = next(iter(others.items()))
            names = ", ".join(repr(o) for o in others)
            message[0] = (
                f"autoresume=True with run_name {run_name!r}, but save_folder {folder} holds "
                f"checkpoints of another run ({names}; e.g. {example.name}) and none of "
                f"{run_name!r}: nothing to resume, and this run's checkpoints would take the "
                f"same names. To continue that run, set run_name={owner}; to start a new run "
                f"there, choose another save_folder, or put {{run_name}} in save_filename.")
    if dist.get_world_size() > 1:
        dist.broadcast_object_list(message)
    if message[0] is not None:
        raise ValueError(message[0])
