"""A callback that SIGKILLs its own process at chosen points of a run, once each (for crash and
resume tests of real ``cadence train`` processes).

Named in a run file by dotted path (the repository on ``PYTHONPATH``)::

    callbacks:
      tests.common.killing.KillAt:
        marker_dir: /tmp/markers
        batches: [3]          # at BATCH_END of batch 3
        during_save: [6]      # in batch 6's save: data written, before the rename into place
        before_pointer: [8]   # in batch 8's save: renamed into place, before ``latest`` moves
        during_upload: [6]    # remote save_folder: batch 6's upload, one file sent

Each kill first writes a marker file in ``marker_dir``; a relaunched run (autoresume) that
passes the same point finds the marker and carries on, so every point kills exactly once.
SIGKILL gives the process no chance to clean up: no ``finally``, no ``atexit``, no flush of
Python-level buffers, as when a node is lost or the OOM killer strikes.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Sequence

from cadence import Callback, State

__all__ = ["KillAt", "kill_now"]


def kill_now() -> None:
    """SIGKILL this process (never returns)."""
    os.kill(os.getpid(), signal.SIGKILL)


class _KillOnReplace:
    """Stands in for the ``os`` module inside ``cadence.checkpoint.checkpoint``: the
    save's rename of its finished temporary into place kills the process instead."""

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    @staticmethod
    def replace(src: Any, dst: Any) -> None:
        if ".tmp-" in os.fspath(src):
            kill_now()
        os.replace(src, dst)


class KillAt(Callback):
    """SIGKILL this process at the given batches (1-based ``state.timestamp.batch``), once each.

    Args:
        marker_dir: where the "already killed here" marker files go (created if missing).
        batches: kill at ``BATCH_END`` of these batches (metrics of the batch unflushed).
        during_save: kill inside the checkpoint save of these batches, after every byte is
            written and synced, before the temporary is renamed to its final name. Needs a
            save due at that batch (the Trainer's ``CheckpointSaver`` runs after user
            callbacks on ``BATCH_CHECKPOINT``).
        before_pointer: kill inside the save of these batches after the rename, before the
            ``latest`` pointer is moved to the new checkpoint.
        during_upload: with a remote ``save_folder``, kill inside the upload of these
            batches' checkpoints once the first of its files is in the bucket (the rest,
            the completion marker and the pointer never get there).
    """

    def __init__(self, marker_dir: str, batches: Sequence[int] = (),
                 during_save: Sequence[int] = (), before_pointer: Sequence[int] = (),
                 during_upload: Sequence[int] = ()) -> None:
        self.marker_dir = Path(marker_dir)
        self.batches, self.during_save = set(batches), set(during_save)
        self.before_pointer, self.during_upload = set(before_pointer), set(during_upload)

    def _first_time(self, kind: str, batch: int) -> bool:
        """Whether this point has not killed yet (and mark it as having killed)."""
        marker = self.marker_dir / f"{kind}-ba{batch}"
        if marker.exists():
            return False
        self.marker_dir.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"{os.getpid()}\n")
        return True

    def batch_end(self, state: State, logger: Any) -> None:
        batch = int(state.timestamp.batch)
        if batch in self.batches and self._first_time("batch_end", batch):
            kill_now()

    def batch_checkpoint(self, state: State, logger: Any) -> None:
        import cadence.callbacks.checkpoint_saver as saver_module
        import cadence.checkpoint.checkpoint as checkpoint_module

        def wait_for_earlier_saves() -> None:
            # an earlier background save (save_async) must reach disk first: the saver waits
            # for it before this batch's save anyway, and armed now its rename (or, for
            # before_pointer, its pointer move) would be killed instead of this batch's
            for callback in state.callbacks:
                if isinstance(callback, saver_module.CheckpointSaver):
                    callback.wait()

        batch = int(state.timestamp.batch)
        if batch in self.during_save and self._first_time("during_save", batch):
            wait_for_earlier_saves()
            checkpoint_module.os = _KillOnReplace()  # type: ignore[assignment]
        if batch in self.before_pointer and self._first_time("before_pointer", batch):
            wait_for_earlier_saves()

            def write_latest(*args: Any, **kwargs: Any) -> None:
                kill_now()

            saver_module.write_latest = write_latest  # type: ignore[assignment]
        if batch in self.during_upload and self._first_time("during_upload", batch):
            _kill_in_upload()


def _kill_in_upload() -> None:
    """Make the next remote upload send its first file, then SIGKILL the process."""
    from cadence.checkpoint.remote import RemoteFolder

    def upload_part(folder: RemoteFolder, local: Path, name: str, rank: int) -> None:
        first = min(local.iterdir()) if local.is_dir() else local
        key = f"{folder.root}/{name}" + (f"/{first.name}" if local.is_dir() else "")
        folder.fs.put_file(str(first), key)
        kill_now()

    RemoteFolder.upload_part = upload_part  # type: ignore[method-assign]
