"""One run per remote save folder: a lock *object* ``<url>/cadence.lock``, kept fresh by a
heartbeat.

Object stores have no ``fcntl`` and the holder's death cannot be observed, so the lock
object holds the holder's host, PID, process start time, run name, a random token and a
``heartbeat`` (seconds since the epoch), rewritten every :data:`HEARTBEAT_SECONDS` by a
daemon thread of rank 0 while the run lives. A starting run:

- creates the object if there is none. On S3 this is a conditional put
  (``If-None-Match: *``, s3fs ``mode="create"``): of two runs starting at once exactly one
  succeeds, the other is refused. Stores without conditional writes get a plain write
  (then two simultaneous starts can both succeed: best effort);
- refuses to start while the holder's heartbeat is younger than :data:`STALE_SECONDS`,
  naming the holder, its last heartbeat and the fix, unless the holder is on this host and
  its process is gone (then it is taken over at once, with a warning: a preempted run
  relaunched on the same node waits for nothing);
- takes over a stale lock (heartbeat older than :data:`STALE_SECONDS`) with a warning.

What this guarantees: a second run started in a folder while the first is alive and can
reach the store is refused. It is not a proof of mutual exclusion: a holder cut off from the
store for longer than :data:`STALE_SECONDS` loses its lock without knowing, and takeover is
delete-then-create, so it relies on the heartbeat, not on a compare-and-swap. Release (at
``close()`` or exit) deletes the object if it still holds this run's token.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import secrets
import socket
import threading
import time
from typing import Any, Optional

from cadence.checkpoint.lock import (
    LOCK_FILENAME, SaveFolderInUse, _alive, _describe, holder_record,
)
from cadence.checkpoint.remote import get_filesystem, join

__all__ = ["HEARTBEAT_SECONDS", "STALE_SECONDS", "RemoteRunLock", "acquire_remote_lock"]

log = logging.getLogger(__name__)

#: How often the holder rewrites its heartbeat (seconds).
HEARTBEAT_SECONDS = 60.0
#: A lock whose heartbeat is older than this (seconds) is stale and taken over.
STALE_SECONDS = 300.0

_HELD: dict[str, RemoteRunLock] = {}


class RemoteRunLock:
    """The lock this process holds on a remote save folder; :meth:`release` gives it back."""

    def __init__(self, url: str, fs: Any, key: str, holder: dict[str, Any]) -> None:
        self.url, self._fs, self._key, self._holder = url, fs, key, holder
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="cadence-lock-heartbeat",
                                        daemon=True)
        self._thread.start()

    @property
    def held(self) -> bool:
        return not self._stop.is_set()

    @property
    def token(self) -> str:
        return str(self._holder["token"])

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self.heartbeat()
            except Exception as exc:  # noqa: BLE001 - the store is unreachable for now
                log.warning("Could not refresh the lock %s: %s", self.url, exc)

    def heartbeat(self) -> None:
        """Rewrite the heartbeat, unless another run has taken the lock over (then warn)."""
        current = _read(self._fs, self._key)
        if current is not None and current.get("token") != self.token:
            log.warning("The lock %s was taken over by %s; this run no longer holds its save "
                        "folder.", self.url, _describe(current))
            self._stop.set()
            return
        self._holder["heartbeat"] = time.time()
        self._fs.pipe_file(self._key, json.dumps(self._holder).encode())

    def release(self) -> None:
        """Stop the heartbeat and delete the lock object if it is still this run's
        (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if _HELD.get(self.url) is self:
            del _HELD[self.url]
        try:
            current = _read(self._fs, self._key)
            if current is not None and current.get("token") == self.token:
                self._fs.rm(self._key)
        except Exception as exc:  # noqa: BLE001 - left to go stale
            log.warning("Could not remove the lock %s (%s); it goes stale in %.0f s.",
                        self.url, exc, STALE_SECONDS)


def _read(fs: Any, key: str) -> Optional[dict[str, Any]]:
    fs.invalidate_cache()
    try:
        raw = fs.cat_file(key)
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(raw)
    except ValueError:
        return {"host": "?", "pid": -1, "started": "?", "run_name": "?", "heartbeat": 0}
    return holder if isinstance(holder, dict) else None


def _create(fs: Any, key: str, data: bytes) -> bool:
    """Create ``key`` only if it does not exist (conditional put where the store has it);
    False when another writer created it first."""
    try:
        fs.pipe_file(key, data, mode="create")
    except TypeError:  # a filesystem without exclusive creation: best effort
        fs.pipe_file(key, data)
    except FileExistsError:  # s3fs: the store's "412 Precondition Failed"
        return False
    return True


def acquire_remote_lock(url: str, run_name: str) -> RemoteRunLock:
    """Lock the remote folder ``url`` for this process's run (rank-local; rank 0 calls it
    through :func:`~cadence.checkpoint.lock.lock_save_folder`).

    Raises:
        SaveFolderInUse: a live run holds the folder (names it, its heartbeat's age and the
            fix).
        ValueError: the URL's filesystem is not installed (names the extra).
    """
    earlier = _HELD.get(url)
    if earlier is not None:
        earlier.release()  # a Trainer of this process that was not closed
    fs, root = get_filesystem(url)
    key = f"{root}/{LOCK_FILENAME}"
    holder = {**holder_record(run_name, secrets.token_hex(8)), "heartbeat": time.time()}
    for _ in range(3):
        if _create(fs, key, json.dumps(holder).encode()):
            lock = _HELD[url] = RemoteRunLock(url, fs, key, holder)
            return lock
        current = _read(fs, key)
        if current is None:
            continue  # released in between: try again
        age = time.time() - float(current.get("heartbeat", 0))
        dead_here = (current.get("host") == socket.gethostname()
                     and current.get("pid") != os.getpid() and not _alive(current))
        if age < STALE_SECONDS and not dead_here:
            raise SaveFolderInUse(
                f"save_folder {url} is in use by {_describe(current)}, whose last heartbeat "
                f"was {age:.0f} s ago (a lock is stale after {STALE_SECONDS:.0f} s). Two runs "
                f"in one save folder would overwrite each other's checkpoints. Wait for that "
                f"run to end, or choose another save_folder; if it has ended, delete "
                f"{join(url, LOCK_FILENAME)} or wait {STALE_SECONDS - age:.0f} s.")
        log.warning("Taking over the lock %s of %s, which is no longer running (%s).",
                    join(url, LOCK_FILENAME), _describe(current),
                    "its process is gone" if dead_here else f"no heartbeat for {age:.0f} s")
        fs.rm(key)
    raise SaveFolderInUse(f"Could not take the lock {join(url, LOCK_FILENAME)}: another run is "
                          f"starting in save_folder {url}.")


@atexit.register
def _release_all() -> None:
    for lock in list(_HELD.values()):
        lock.release()
