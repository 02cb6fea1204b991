"""A run's save folder, local or remote, decided once: :class:`RunFolder`.

The Trainer builds one :class:`RunFolder` from ``save_folder`` (``{run_name}`` filled in) and
hands it to the checkpoint saver, to resume (:func:`~cadence.checkpoint.resume.resolve_load_path`)
and to the start checks below; only its constructor asks whether the folder is local or an
fsspec URL (``s3://bucket/runs/x``, :mod:`~cadence.checkpoint.remote`). It holds the URL, the
remote handle (None when local), the local folder the run writes into (the folder itself,
or a remote folder's stage) and, once :meth:`RunFolder.lock` took it, the folder's lock
(:mod:`~cadence.checkpoint.lock`).

It also checks at start that an autoresumed run can resume
(:func:`check_autoresume_folder`): its save folder must not hold another run's checkpoints
under the names this run would write. Autoresume continues the newest checkpoint *of its own
run* (by the ``run_name`` in each checkpoint's metadata). When a folder holds none of this
run's but another run's, whose names this run's ``save_filename`` would produce again
(``ep0-ba100.pt``), the run would train from scratch and then fail at its first save, or with
``save_overwrite`` destroy the other run's checkpoints. This is refused at start, naming the
other run and the fix. Folders holding several runs whose names cannot collide
(``save_filename`` with ``{run_name}``) are fine.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from cadence.checkpoint.files import could_write
from cadence.checkpoint.lock import (
    AnyRunLock, SaveFolderInUse, acquire_remote_lock, acquire_run_lock,
)
from cadence.checkpoint.remote import RemoteFolder, is_remote, local_path
from cadence.checkpoint.store import CheckpointStore, LocalFolder
from cadence.utils import dist

__all__ = ["RunFolder", "check_autoresume_folder", "could_write"]

log = logging.getLogger(__name__)


class RunFolder:
    """A run's save folder: whether it is remote is decided here, once.

    Args:
        url: the save folder, ``{run_name}`` filled in: a local path, a ``file://`` URL, or
            an fsspec URL (``s3://bucket/runs/x``).

    Attributes:
        url: the folder as given.
        remote: the handle of a remote folder (its checkpoints, markers, ``latest`` pointer
            and logs); None when the folder is local.
        local: where this process writes the run's files: the folder itself, or a remote
            folder's local stage (:func:`~cadence.checkpoint.remote.stage_dir`).
        store: the folder's checkpoints (:class:`~cadence.checkpoint.store.CheckpointStore`):
            :attr:`remote`, or the local folder's
            :class:`~cadence.checkpoint.store.LocalFolder`.
        run_lock: the folder's lock while rank 0 holds it (:meth:`lock`), else None.

    Raises:
        ValueError: a URL whose filesystem is unknown or not installed (the message names the
            extra to install), or that carries credentials
            (:func:`~cadence.checkpoint.remote.get_filesystem`). Nothing is contacted.
    """

    def __init__(self, url: str) -> None:
        self.url = str(url)
        self.remote: Optional[RemoteFolder] = RemoteFolder(self.url) if is_remote(
            self.url) else None
        self.local: Path = self.remote.stage if self.remote is not None else local_path(
            self.url)
        self.store: CheckpointStore = (self.remote if self.remote is not None
                                       else LocalFolder(self.local))
        self.run_lock: Optional[AnyRunLock] = None

    @classmethod
    def of(cls, save_folder: Optional[str], run_name: str) -> Optional[RunFolder]:
        """The run folder of the ``save_folder`` template (``{run_name}`` filled in), or None
        when the run has none.

        Raises:
            ValueError: as the constructor.
        """
        return None if save_folder is None else cls(save_folder.format(run_name=run_name))

    @property
    def is_remote(self) -> bool:
        """Whether the folder is in object storage (its files are staged in :attr:`local`)."""
        return self.remote is not None

    def location(self, name: str) -> str:
        """Where the run's file or checkpoint ``name`` lives: its URL in a remote folder,
        else its local path."""
        return self.store.location(name)

    def __repr__(self) -> str:
        return f"RunFolder({self.url!r})"

    # ------------------------------------------------------------------ the run's tenure
    def lock(self, run_name: str) -> None:
        """Rank 0 takes the folder's lock for run ``run_name`` (a local folder: a lock file;
        a remote one: a lock object with a heartbeat); every rank raises if it could not
        (a collective when several ranks run). Then, for a remote folder, rank 0 copies
        its logs into the stage, so a resumed run appends to them.

        Raises:
            SaveFolderInUse: another live run holds the folder (the message names it and
                the fix).
            OSError: the store cannot be reached or refuses the credentials.
        """
        error: list[Optional[str]] = [None]
        if dist.get_global_rank() == 0:
            try:
                self.run_lock = (acquire_remote_lock(self.url, run_name) if self.is_remote
                                 else acquire_run_lock(self.local, run_name))
            except SaveFolderInUse as exc:
                error[0] = str(exc)
        if dist.get_world_size() > 1:
            dist.broadcast_object_list(error)
        if error[0] is not None:
            raise SaveFolderInUse(error[0])
        self.sync_logs(download=True)

    def sync_logs(self, download: bool) -> None:
        """With a remote folder, on rank 0: copy its logs (``metrics.jsonl``...) into the
        stage (``download=True``), or upload them (``download=False``). A local folder:
        nothing.

        Raises:
            OSError: on download, when the store cannot be reached or the credentials are
                refused (an upload failure is logged as a warning instead: the checkpoints
                are safe, only the logs' tail is missing).
        """
        if self.remote is None or dist.get_global_rank() != 0:
            return
        if download:
            self.remote.download_artifacts()
            return
        try:
            self.remote.upload_artifacts()
        except OSError as exc:
            log.warning("Could not upload the run's logs to %s: %s", self.url, exc)

    def release(self) -> None:
        """Give the folder's lock back (idempotent; no lock held: nothing)."""
        if self.run_lock is not None:
            self.run_lock.release()

    def close(self) -> None:
        """At the end of the run: upload a remote folder's logs (their last lines, after the
        loggers closed), then release the lock (idempotent)."""
        self.sync_logs(download=False)
        self.release()

    # ------------------------------------------------------------------ start checks
    def newest_checkpoint(self, latest_filename: str, run_name: str) -> Optional[str]:
        """The newest complete checkpoint in the folder (where :meth:`location` puts it):
        the one ``latest_filename`` names, else the newest of run ``run_name``; None when
        there is none. Rank-local.

        Raises:
            CheckpointError: the ``latest`` pointer names something outside the folder.
        """
        name = self.store.newest(latest_filename, run_name)
        return None if name is None else self.store.location(name)

    def foreign_checkpoints(self, run_name: str, filename: str) -> dict[str, str]:
        """Another run's name -> the name of one of its checkpoints in the folder that run
        ``run_name`` could write too (``filename``: its ``save_filename`` template); empty
        when the folder holds a checkpoint of ``run_name`` (autoresume takes it). Rank-local.
        """
        others: dict[str, str] = {}
        for name, owner in self.store.owners():
            if owner == run_name:
                return {}
            if could_write(filename, run_name, name):
                others.setdefault(str(owner), name)
        return others


def check_autoresume_folder(folder: Optional[RunFolder], run_name: str, filename: str) -> None:
    """Refuse an autoresume into ``folder`` that holds no checkpoint of ``run_name`` but another
    run's, under names this run would write. Rank 0 looks; every rank raises.

    Args:
        folder: the run's save folder (None: nothing to check).
        run_name: this run's name.
        filename: this run's ``save_filename`` template.

    Raises:
        ValueError: naming the other run(s), one of their checkpoints, and the fixes.
    """
    if folder is None:
        return
    message: list[Optional[str]] = [None]
    if dist.get_global_rank() == 0:
        others = folder.foreign_checkpoints(run_name, filename)
        if others:
            owner, example = next(iter(others.items()))
            names = ", ".join(repr(o) for o in others)
            message[0] = (
                f"autoresume=True with run_name {run_name!r}, but save_folder {folder.url} "
                f"holds checkpoints of another run ({names}; e.g. {example}) and none of "
                f"{run_name!r}: nothing to resume, and this run's checkpoints would take the "
                f"same names. To continue that run, set run_name={owner}; to start a new run "
                f"there, choose another save_folder, or put {{run_name}} in save_filename.")
    if dist.get_world_size() > 1:
        dist.broadcast_object_list(message)
    if message[0] is not None:
        raise ValueError(message[0])
