"""A run's checkpoint folder, local or remote, behind one interface: :class:`CheckpointStore`.

The rules every checkpoint folder follows are written here once; a backend only says how to
read, write, list and rename its objects: :class:`~cadence.checkpoint.files.LocalFolder` (a
directory) and :class:`~cadence.checkpoint.remote.RemoteFolder` (an fsspec URL).

- **Complete.** A checkpoint is listed, pointed at, resumed from or loaded only once it is
  complete. Locally that is its final name: it is written under a temporary name and renamed
  (``os.replace``, atomic on POSIX) after every rank finished, its files fsynced. In object
  storage, which has no atomic rename, it is its completion marker
  ``<name>.cadence-complete``, written by rank 0 after every rank's upload.
- **The latest pointer.** ``latest-{run_name}`` is what autoresume reads and what every save
  moves, in every folder: a small text object holding the name of one complete checkpoint
  inside its folder (a ``full`` file or a ``sharded`` directory alike), written after that
  checkpoint is complete (locally replaced atomically), and only ever resolved inside its
  own folder. Composer's ``latest-rank{rank}.pt`` stays the user-facing name: in a local
  folder a relative symlink to the newest ``full`` checkpoint, in Composer's format (what
  ``load_path: <folder>/latest-rank0.pt`` loads). It is not written for ``sharded``
  checkpoints (a directory named ``.pt`` would be taken for a file) nor in object storage
  (no symlinks there; the saver hands Composer's ``.symlink`` file to logger destinations
  that store files). A ``save_latest_filename`` that does not end in ``.pt`` (cadence's
  older API) names the pointer itself (:func:`~cadence.checkpoint.files.pointer_template`).
  Every form earlier runs wrote is read: the text pointer, local or remote, naming a
  checkpoint by name or by a relative path inside the folder.
- **Candidates.** The checkpoints autoresume tries, newest first: the pointer's, then the
  run's other complete ones, most recently written first.
- **Set aside.** A checkpoint autoresume rejected (it failed its checksums and the run fell
  back to an earlier one) is renamed ``<name>.rejected-<UTC time>`` (:meth:`move_aside`),
  never deleted; a state with NaN/inf is written as ``<name>.nonfinite``
  (:mod:`~cadence.checkpoint.finite`). Neither is ever listed, pointed at or resumed from.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path, PurePosixPath
from typing import Any, Iterator, Optional

from cadence.checkpoint.errors import CheckpointError
from cadence.checkpoint.files import (
    REJECTED_MARK, atomic_write_bytes, complete_checkpoints, is_aside, is_complete,
    remove_checkpoint,
)

__all__ = ["CheckpointStore", "LocalFolder", "UNREADABLE", "find_latest_checkpoint",
           "read_latest", "write_latest"]

log = logging.getLogger(__name__)

#: What :meth:`CheckpointStore.owner` returns for a checkpoint whose run cannot be read.
UNREADABLE = object()


class CheckpointStore:
    """A run's checkpoint folder: the rules of the module docstring over a backend's objects.
    Checkpoints and the pointer are named relative to the folder.

    Attributes:
        where: the folder, for messages (a path or a URL).
        fresh_start: how to start afresh when none of the run's checkpoints passes.
        copy_errors: the errors of :meth:`local_copy` that reject a candidate (others
            propagate).
    """

    where: str
    fresh_start = "Move them away to start afresh"
    copy_errors: tuple[type[BaseException], ...] = (CheckpointError,)

    # ---------------------------------------------- the backend's part (names relative)
    def location(self, name: str) -> str:
        """Where ``name`` is: a local path or a URL."""
        raise NotImplementedError

    def read_object(self, name: str) -> Optional[bytes]:
        """The bytes of the small object ``name`` (a pointer); None when there is none."""
        raise NotImplementedError

    def write_object(self, name: str, data: bytes) -> None:
        """Replace the small object ``name`` with ``data`` (locally: atomically)."""
        raise NotImplementedError

    def exists(self, name: str) -> bool:
        """Whether anything is named ``name`` in the folder."""
        raise NotImplementedError

    def is_complete(self, name: str) -> bool:
        """Whether ``name`` is a complete checkpoint (see the module docstring)."""
        raise NotImplementedError

    def complete(self) -> list[tuple[str, float]]:
        """``(name, when written)`` of each complete checkpoint not set aside, any order."""
        raise NotImplementedError

    def owner(self, name: str) -> Any:
        """The run name checkpoint ``name`` records, or :data:`UNREADABLE`."""
        raise NotImplementedError

    def rename(self, name: str, new: str) -> None:
        """Rename checkpoint ``name`` to ``new``, never deleting its data (raises OSError)."""
        raise NotImplementedError

    def remove(self, name: str) -> None:
        """Delete checkpoint ``name`` (missing is fine; a remote one: its marker first)."""
        raise NotImplementedError

    def local_copy(self, name: str) -> Path:
        """A local path of checkpoint ``name`` to verify and load (remote: downloaded)."""
        raise NotImplementedError

    def drop_copy(self, name: str) -> None:
        """Remove what :meth:`local_copy` fetched for a rejected ``name``."""

    def before_resume(self, run_name: Optional[str]) -> None:
        """Rank 0's repairs before a checkpoint to resume is chosen."""

    def inside(self, name: str) -> bool:
        """Whether the relative ``name`` stays inside the folder (locally: no symlink out)."""
        return True

    # ------------------------------------------------------------------ the latest pointer
    def write_latest(self, pointer: str, name: str) -> None:
        """Point ``pointer`` at the complete checkpoint ``name``."""
        self.write_object(pointer, (name + "\n").encode())

    def pointed_name(self, pointer: str) -> Optional[str]:
        """The name the pointer holds (None when there is no pointer), unchecked for
        completeness.

        Raises:
            CheckpointError: the pointer holds binary data or an empty name, or names
                something outside its folder (an absolute path, ``..``, a symlink out).
        """
        raw = self.read_object(pointer)
        if raw is None:
            return None
        try:
            text: Optional[str] = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            text = None
        if not text or any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
            what = "is empty" if text == "" else f"holds binary data ({raw[:16]!r}...)"
            raise CheckpointError(
                f"The latest pointer {self.location(pointer)} {what}, not the name of a "
                f"checkpoint in its folder. Delete it: autoresume then picks the newest "
                f"complete checkpoint of the run.")
        name = PurePosixPath(text)
        if name.is_absolute() or ".." in name.parts or not self.inside(str(name)):
            raise CheckpointError(
                f"The latest pointer {self.location(pointer)} names {text!r}, which is outside "
                f"its folder {self.where}; a pointer may only name a checkpoint inside its own "
                f"folder. Delete the pointer (autoresume then picks the newest complete "
                f"checkpoint of the run), or pass the checkpoint you mean as load_path.")
        return str(name)

    def read_latest(self, pointer: str) -> Optional[str]:
        """The checkpoint the pointer names, if the pointer exists and the checkpoint is
        complete and not set aside (else a WARNING names what is wrong).

        Raises:
            CheckpointError: as :meth:`pointed_name`.
        """
        name = self.pointed_name(pointer)
        if name is None:
            return None
        own_folder = name in ("", ".")
        if not own_folder and not is_aside(name) and self.is_complete(name):
            return name
        what = ("is its own folder" if own_folder else "does not exist"
                if not self.exists(name) else "was set aside" if is_aside(name)
                else "is not a complete checkpoint")
        log.warning("The latest pointer %s holds %r, which %s; it is ignored, and the newest "
                    "complete checkpoint of the run in %s is used instead (if any).",
                    self.location(pointer), name, what, self.where)
        return None

    # ------------------------------------------------------------------ listing
    def candidates(self, pointer: str, run_name: Optional[str]) -> Iterator[str]:
        """Complete checkpoints of run ``run_name`` (None: any run), newest first: the one
        the pointer names (whoever wrote it), then the others, most recently written first
        (lazily: a consumer that stops at the first pays for one owner look-up).

        Raises:
            CheckpointError: as :meth:`pointed_name`.
        """
        pointed = self.read_latest(pointer)
        if pointed is not None:
            yield pointed
        rest = sorted(self.complete(), key=lambda entry: entry[1], reverse=True)
        for name, _ in rest:
            if name not in (pointed, pointer) and (run_name is None
                                                   or self.owner(name) == run_name):
                yield name

    def newest(self, pointer: str, run_name: Optional[str]) -> Optional[str]:
        """The first of :meth:`candidates` (unverified), or None."""
        return next(self.candidates(pointer, run_name), None)

    def owners(self) -> Iterator[tuple[str, Any]]:
        """``(name, run name)`` of each complete checkpoint, by name (unreadable ones
        skipped: autoresume reports those)."""
        for name, _ in sorted(self.complete()):
            owner = self.owner(name)
            if owner is not UNREADABLE:
                yield name, owner

    # ------------------------------------------------------------------ setting aside
    def move_aside(self, name: str) -> str:
        """Rename checkpoint ``name`` to ``<name>.rejected-<UTC time>`` in its folder (never
        deleting it), so no later save collides with it and no finder takes it again.
        Returns the new name.

        Raises:
            OSError: the rename failed (e.g. a read-only folder).
        """
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        new, count = f"{name}{REJECTED_MARK}{stamp}", 1
        while self.exists(new):
            count += 1
            new = f"{name}{REJECTED_MARK}{stamp}-{count}"
        self.rename(name, new)
        return new

    def set_aside(self, name: str) -> str:
        """:meth:`move_aside`, reported as ``old -> new`` for a message (or why it could
        not be moved: the run's save of that name will then refuse to replace it)."""
        try:
            return f"{self.location(name)} -> {PurePosixPath(self.move_aside(name)).name}"
        except OSError as exc:
            return f"{self.location(name)} (could not be moved aside: {exc})"

    # ------------------------------------------------------------------ resuming
    def newest_intact(self, pointer: str, run_name: Optional[str],
                      require_checksums: bool = True) -> Optional[str]:
        """Where the newest checkpoint of ``run_name`` that passes its checksums is (a path
        or URL; a remote one stays downloaded in the stage for the load), or None when the
        run has none. Each rejected candidate is logged as a WARNING naming it and the file
        that failed; when an earlier one passes, the rejected newer ones are set aside
        (:meth:`set_aside`) and the pointer moved to the one resumed from. Rank-local
        (rank 0).

        Raises:
            CheckpointError: the pointer is garbage or points outside the folder; or the run
                has checkpoints there and none passes (the message lists why each failed).
        """
        from cadence.checkpoint.checkpoint import verify

        self.before_resume(run_name)
        rejected: list[str] = []
        rejected_names: list[str] = []
        for name in self.candidates(pointer, run_name):
            try:
                verify(self.local_copy(name), require=require_checksums)
            except self.copy_errors as exc:
                self.drop_copy(name)
                log.warning("Autoresume rejects checkpoint %s: %s", self.location(name), exc)
                rejected.append(f"{self.location(name)}: {exc}")
                rejected_names.append(name)
                continue
            if rejected:
                moved = [self.set_aside(bad) for bad in rejected_names]
                self.write_latest(pointer, name)
                log.warning("Autoresume falls back to %s, the newest checkpoint of run %s that "
                            "passes its checksums; the rejected checkpoints were moved aside, "
                            "not deleted: %s.", self.location(name), run_name, ", ".join(moved))
            return self.location(name)
        if rejected:
            raise CheckpointError(
                f"Autoresume found checkpoints of run {run_name} in {self.where}, but none "
                f"passes its checksums: {'; '.join(rejected)}. {self.fresh_start}, or pass a "
                f"checkpoint you trust as load_path.")
        return None


class LocalFolder(CheckpointStore):
    """A checkpoint folder on a local filesystem (:class:`CheckpointStore`): complete is the
    final name, the pointer a text file replaced atomically (fsynced), a set-aside an
    ``os.replace``.

    Args:
        folder: the directory (it need not exist yet: then it holds nothing).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.where = str(self.folder)

    def location(self, name: str) -> str:
        return str(self.folder / name)

    def read_object(self, name: str) -> Optional[bytes]:
        path = self.folder / name
        return path.read_bytes() if path.is_file() else None

    def write_object(self, name: str, data: bytes) -> None:
        atomic_write_bytes(self.folder / name, data)

    def exists(self, name: str) -> bool:
        path = self.folder / name
        return path.exists() or path.is_symlink()

    def is_complete(self, name: str) -> bool:
        return is_complete(self.folder / name)

    def complete(self) -> list[tuple[str, float]]:
        return [(p.name, p.stat().st_mtime_ns) for p in complete_checkpoints(self.folder)]

    def owner(self, name: str) -> Any:
        from cadence.checkpoint.checkpoint import read_metadata

        try:
            return read_metadata(self.folder / name).get("run_name")
        except CheckpointError:
            return UNREADABLE

    def remove(self, name: str) -> None:
        remove_checkpoint(self.folder / name)

    def rename(self, name: str, new: str) -> None:
        os.replace(self.folder / name, self.folder / new)

    def local_copy(self, name: str) -> Path:
        return self.folder / name

    def inside(self, name: str) -> bool:
        try:
            (self.folder / name).resolve().relative_to(self.folder.resolve())
        except ValueError:
            return False  # a symlink leading out of the folder
        return True


def write_latest(folder: Path, latest_filename: str, checkpoint_name: str) -> None:
    """Point ``folder/latest_filename`` at ``checkpoint_name`` (atomically)."""
    LocalFolder(folder).write_latest(latest_filename, checkpoint_name)


def read_latest(folder: Path, latest_filename: str) -> Optional[Path]:
    """The checkpoint the pointer names, if the pointer exists and the checkpoint is complete.

    Raises:
        CheckpointError: the pointer holds garbage or names a path outside ``folder``.
    """
    name = LocalFolder(folder).read_latest(latest_filename)
    return None if name is None else folder / name


def find_latest_checkpoint(folder: Path, latest_filename: str,
                           run_name: Optional[str] = None) -> Optional[Path]:
    """The newest complete checkpoint in ``folder``: the one ``latest`` names, else the most
    recently modified complete one (of run ``run_name`` when given); temporaries, partial
    directories and checkpoints set aside are skipped.

    Raises:
        CheckpointError: the ``latest`` pointer holds garbage or names a path outside
            ``folder`` (see :func:`read_latest`).
    """
    name = LocalFolder(folder).newest(latest_filename, run_name)
    return None if name is None else folder / name
