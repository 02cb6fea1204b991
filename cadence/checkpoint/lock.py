"""One run per save folder: a lock file, ``<save_folder>/cadence.lock``, held while a run is
alive.

Two runs writing into one folder overwrite each other's checkpoints, interleave
``metrics.jsonl`` and autoresume from each other. So the Trainer takes the folder's lock when
it starts (rank 0 only: the folder is shared by every rank and node) and releases it in
``close()`` or when the process exits. The file holds the holder's host, PID, process start
time, run name and start time (JSON), so a refusal can name the run that holds the folder.

How holding is decided:

- The file is locked with ``fcntl.lockf`` (a POSIX record lock): the kernel (or the NFS lock
  manager) drops it when the holder dies, however it dies, and a forked child (a DataLoader
  worker) does not inherit it. A live holder means refusal at start
  (:class:`SaveFolderInUse`, naming host, PID and start time, and the fix).
- A file whose lock is free but which still names a holder was left by a run that died
  without releasing it (``SIGKILL``, node failure): it is taken over with a warning naming
  the dead run.
- On a filesystem without POSIX locks (``ENOLCK``, ``ENOSYS``: e.g. Lustre mounted without
  ``flock``), the file's content decides: a holder on this host whose PID is not alive (or
  is another process now) is taken over with a warning; a live one, or one on another host
  (which cannot be checked from here), is refused.
- A second Trainer in the same process (a notebook, a test) takes the lock over from the
  earlier one, which was not closed.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import functools
import json
import logging
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

from cadence.utils import dist

__all__ = ["LOCK_FILENAME", "RunLock", "SaveFolderInUse", "acquire_run_lock", "lock_save_folder",
           "release_on_error"]

log = logging.getLogger(__name__)

_F = TypeVar("_F", bound=Callable[..., None])

#: The lock file's name inside the save folder.
LOCK_FILENAME = "cadence.lock"

_HELD: dict[str, RunLock] = {}  # lock path -> the lock this process holds on it
_NO_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


class SaveFolderInUse(RuntimeError):
    """Another live run holds the save folder's lock (the message names it and the fix)."""


def _proc_start(pid: int) -> Optional[int]:
    """The start time of process ``pid`` in clock ticks since boot (Linux ``/proc``); None
    when it has no entry there or has ended (a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return None if fields[0] == b"Z" else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(holder: dict[str, Any]) -> bool:
    """Whether ``holder`` (on this host) is a live process: its PID exists, has not ended,
    and started when the holder did (so a reused PID is not taken for it)."""
    pid = int(holder.get("pid", -1))
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    if not os.path.isdir("/proc/self"):
        return True  # no /proc to look closer
    start = _proc_start(pid)
    return start is not None and holder.get("pid_start") in (None, start)


def _describe(holder: dict[str, Any]) -> str:
    return (f"run {holder.get('run_name')!r} (host {holder.get('host')}, pid "
            f"{holder.get('pid')}, started {holder.get('started')})")


def _read_holder(fd: int) -> Optional[dict[str, Any]]:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = b""
    while chunk := os.read(fd, 65536):
        raw += chunk
    if not raw.strip():
        return None
    try:
        holder = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {"host": "?", "pid": -1, "started": "?", "run_name": "?"}
    return holder if isinstance(holder, dict) else None


class RunLock:
    """The lock this process holds on a save folder; :meth:`release` gives it back."""

    def __init__(self, path: Path, fd: int, token: str) -> None:
        self.path, self._fd, self.token = path, fd, token

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Remove the lock file and unlock (idempotent; a lock taken over by a later Trainer of
        this process is left to it)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if _HELD.get(str(self.path)) is self:
                del _HELD[str(self.path)]
                holder = _read_holder(fd)
                if holder is not None and holder.get("token") == self.token:
                    try:
                        self.path.unlink()  # while locked: no one takes an unlinked file
                    except FileNotFoundError:
                        pass
        finally:
            os.close(fd)  # drops the POSIX lock


def _refusal(path: Path, holder: Optional[dict[str, Any]], how: str) -> SaveFolderInUse:
    who = _describe(holder) if holder else "another process (the lock file names no holder)"
    return SaveFolderInUse(
        f"save_folder {path.parent} is in use by {who}, which {how}. Two runs in one save "
        f"folder would overwrite each other's checkpoints. Wait for that run to end (or stop "
        f"it), or choose another save_folder. If that run has ended and its lock was left "
        f"behind, delete {path}.")


def holder_record(run_name: str, token: str) -> dict[str, Any]:
    """Who holds a lock: this host, PID and process start time, the run and a token (the
    content of a local lock file and of a remote lock object)."""
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "pid_start": _proc_start(os.getpid()), "run_name": run_name,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "token": token}


def _write_holder(fd: int, run_name: str, token: str) -> None:
    holder = holder_record(run_name, token)
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, (json.dumps(holder) + "\n").encode("utf-8"))
    os.fsync(fd)


def _take_over_warning(path: Path, holder: dict[str, Any]) -> None:
    log.warning("Taking over the lock %s of %s, which is no longer running (it ended without "
                "releasing it).", path, _describe(holder))


def acquire_run_lock(folder: Path, run_name: str) -> RunLock:
    """Lock ``folder`` for this process's run (rank-local; see :func:`lock_save_folder`).

    Raises:
        SaveFolderInUse: a live run holds the folder; the message names its host, PID and
            start time, and the fix.
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILENAME
    earlier = _HELD.get(str(path))
    if earlier is not None:
        log.info("Run %s takes the lock on %s over from an earlier Trainer of this process "
                 "that was not closed.", run_name, folder)
        earlier.release()
    token = secrets.token_hex(8)
    for _ in range(10):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):
            holder = _read_holder(fd)
            os.close(fd)
            raise _refusal(path, holder, "is running") from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in _NO_LOCKS:
                raise
            return _acquire_without_locks(path, run_name, token)
        try:
            same_file = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same_file = False
        if not same_file:  # released (unlinked) between our open and lock: try again
            os.close(fd)
            continue
        holder = _read_holder(fd)
        if holder is not None:
            if (holder.get("host") == socket.gethostname() and holder.get("pid") != os.getpid()
                    and _alive(holder)):
                os.close(fd)  # its lock is not visible here, but the process runs
                raise _refusal(path, holder, "is running on this host")
            _take_over_warning(path, holder)
        _write_holder(fd, run_name, token)
        lock = _HELD[str(path)] = RunLock(path, fd, token)
        return lock
    raise SaveFolderInUse(f"Could not take the lock {path}: it was replaced 10 times while "
                          f"trying; another run is starting in save_folder {folder}.")


def _acquire_without_locks(path: Path, run_name: str, token: str) -> RunLock:
    """The lock by exclusive creation, for filesystems without POSIX locks."""
    for _ in range(2):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            fd = os.open(path, os.O_RDONLY)
            try:
                holder = _read_holder(fd)
            finally:
                os.close(fd)
            if holder is None or holder.get("host") != socket.gethostname():
                raise _refusal(path, holder, "may be running on another host (this "
                                             "filesystem has no file locks to check)") from None
            if _alive(holder):
                raise _refusal(path, holder, "is running") from None
            _take_over_warning(path, holder)
            path.unlink(missing_ok=True)
            continue
        _write_holder(fd, run_name, token)
        lock = _HELD[str(path)] = RunLock(path, fd, token)
        return lock
    raise SaveFolderInUse(f"Could not create the lock {path}: another run is starting in "
                          f"save_folder {path.parent}.")


def lock_save_folder(folder: Optional[str], run_name: str) -> Optional[Any]:
    """Rank 0 locks the run's ``folder`` (a remote URL: a lock object with a heartbeat,
    :mod:`~cadence.checkpoint.remote_lock`); every rank raises if it could not (a
    collective when several ranks run). No folder: no lock.

    Returns:
        The lock (its ``release()`` gives it back) on rank 0, else None.

    Raises:
        SaveFolderInUse: another live run holds ``folder``.
    """
    if folder is None:
        return None
    from cadence.checkpoint.remote import is_remote, local_path

    lock: Optional[Any] = None
    error: list[Optional[str]] = [None]
    if dist.get_global_rank() == 0:
        try:
            if is_remote(folder):
                from cadence.checkpoint.remote_lock import acquire_remote_lock

                lock = acquire_remote_lock(folder, run_name)
            else:
                lock = acquire_run_lock(local_path(folder), run_name)
        except SaveFolderInUse as exc:
            error[0] = str(exc)
    if dist.get_world_size() > 1:
        dist.broadcast_object_list(error)
    if error[0] is not None:
        raise SaveFolderInUse(error[0])
    return lock


def release_on_error(attribute: str) -> Callable[[_F], _F]:
    """Decorate an ``__init__`` that takes a lock into ``self.<attribute>``: when it raises
    after taking the lock, the lock is released (no half-built object keeps the folder)."""
    def decorate(init: _F) -> _F:
        @functools.wraps(init)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                init(self, *args, **kwargs)
            except BaseException:
                lock = getattr(self, attribute, None)
                if lock is not None:
                    lock.release()
                raise
        return wrapper  # type: ignore[return-value]
    return decorate


@atexit.register
def _release_all() -> None:
    for lock in list(_HELD.values()):
        lock.release()
