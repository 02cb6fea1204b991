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

Remote save folders (``s3://...``) have no ``fcntl``, and the holder's death cannot be
observed there, so the lock is an *object* ``<url>/cadence.lock`` kept fresh by a heartbeat.
It holds the same record plus a ``heartbeat`` (seconds since the epoch), rewritten every
:data:`HEARTBEAT_SECONDS` by a daemon thread of rank 0 while the run lives. A starting run:

- creates the object if there is none. On S3 this is a conditional put
  (``If-None-Match: *``, s3fs ``mode="create"``): of two runs starting at once exactly one
  succeeds, the other is refused. Stores without conditional writes get a plain write
  (then two simultaneous starts can both succeed: best effort);
- refuses to start while the holder's heartbeat is younger than :data:`STALE_SECONDS`,
  naming the holder, its last heartbeat and the fix, unless the holder is on this host and
  its process is gone (then it is taken over at once, with a warning: a preempted run
  relaunched on the same node waits for nothing);
- takes over a stale lock (heartbeat older than :data:`STALE_SECONDS`) with a warning.

What the remote lock guarantees: a second run started in a folder while the first is alive
and can reach the store is refused. It is not a proof of mutual exclusion: a holder cut off
from the store for longer than :data:`STALE_SECONDS` loses its lock without knowing, and
takeover is delete-then-create, so it relies on the heartbeat, not on a compare-and-swap.
Release (at ``close()`` or exit) deletes the object if it still holds this run's token.

A restarted group (``cadence launch --max_restarts N``: torchrun restarts every rank after one
failed) takes over the lock of its own earlier attempt: the record holds torchrun's run id
(``TORCHELASTIC_RUN_ID``; ``cadence launch`` gives each launch its own) and restart count,
and a holder with the same run id and a lower restart count is taken over at once, on any
host, with an INFO line (:func:`earlier_attempt`). Anonymous run ids (torchrun's ``none``)
never match, so two unrelated jobs are never taken for one.

Which of the two a run takes is decided by its
:class:`~cadence.checkpoint.run_folder.RunFolder` (rank 0 locks; every rank raises).
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
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, TypeVar, Union

from cadence.checkpoint.remote import get_filesystem, join

__all__ = ["HEARTBEAT_SECONDS", "LOCK_FILENAME", "STALE_SECONDS", "AnyRunLock",
           "RemoteRunLock", "RunLock", "SaveFolderInUse", "acquire_remote_lock",
           "acquire_run_lock", "alive", "attempt", "describe", "earlier_attempt", "holder_record",
           "release_on_error"]

log = logging.getLogger(__name__)

_F = TypeVar("_F", bound=Callable[..., None])

#: Run ids that do not name one job (torchrun's default), so never prove "the same run".
_ANONYMOUS_RUN_IDS = ("", "none")
#: The lock file's name inside the save folder.
LOCK_FILENAME = "cadence.lock"
#: How often the holder of a remote lock rewrites its heartbeat (seconds).
HEARTBEAT_SECONDS = 60.0
#: A remote lock whose heartbeat is older than this (seconds) is stale and taken over.
STALE_SECONDS = 300.0

#: lock file path (local) or folder URL (remote) -> the lock this process holds on it
_HELD: dict[str, AnyRunLock] = {}
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


def alive(holder: dict[str, Any]) -> bool:
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


def describe(holder: dict[str, Any]) -> str:
    """A lock holder's record as a refusal names it: run, host, PID and start time (and the
    torchrun attempt, when it has one)."""
    tried = (f", torchrun run id {holder['run_id']} attempt {holder.get('restart', 0)}"
             if holder.get("run_id") else "")
    return (f"run {holder.get('run_name')!r} (host {holder.get('host')}, pid "
            f"{holder.get('pid')}, started {holder.get('started')}{tried})")


def attempt(environ: Mapping[str, str] = os.environ) -> tuple[str, int] | None:
    """``(run id, restart count)`` of this worker group under torchrun, or ``None`` outside
    torchrun or when the run id is torchrun's anonymous default (``none``)."""
    run_id = environ.get("TORCHELASTIC_RUN_ID", "")
    if run_id in _ANONYMOUS_RUN_IDS:
        return None
    try:
        return run_id, int(environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return None


def earlier_attempt(holder: Optional[dict[str, Any]]) -> bool:
    """Whether ``holder`` is an earlier attempt of this process's torchrun job: the same run
    id (not torchrun's anonymous ``none``) and a lower restart count. torchrun restarts a
    group only after stopping the previous one, so such a holder is gone (wherever it ran)."""
    this = attempt()
    if this is None or not holder or holder.get("run_id") != this[0]:
        return False
    try:
        return int(holder.get("restart", 0)) < this[1]
    except (TypeError, ValueError):
        return False


def _earlier_attempt_info(where: str, holder: dict[str, Any]) -> None:
    log.info("Taking over the lock %s from %s: an earlier attempt of this job, restarted by "
             "torchrun (--max_restarts).", where, describe(holder))


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
    who = describe(holder) if holder else "another process (the lock file names no holder)"
    return SaveFolderInUse(
        f"save_folder {path.parent} is in use by {who}, which {how}. Two runs in one save "
        f"folder would overwrite each other's checkpoints. Wait for that run to end (or stop "
        f"it), or choose another save_folder. If that run has ended and its lock was left "
        f"behind, delete {path}.")


def holder_record(run_name: str, token: str) -> dict[str, Any]:
    """Who holds a lock: this host, PID and process start time, the run and a token (the
    content of a local lock file and of a remote lock object)."""
    record = {"host": socket.gethostname(), "pid": os.getpid(),
              "pid_start": _proc_start(os.getpid()), "run_name": run_name,
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "token": token}
    this = attempt()
    if this is not None:  # a torchrun attempt (see earlier_attempt)
        record["run_id"], record["restart"] = this
    return record


def _write_holder(fd: int, run_name: str, token: str) -> None:
    holder = holder_record(run_name, token)
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, (json.dumps(holder) + "\n").encode("utf-8"))
    os.fsync(fd)


def _take_over_warning(path: Path, holder: dict[str, Any]) -> None:
    if earlier_attempt(holder):
        _earlier_attempt_info(str(path), holder)
        return
    log.warning("Taking over the lock %s of %s, which is no longer running (it ended without "
                "releasing it).", path, describe(holder))


def acquire_run_lock(folder: Path, run_name: str) -> RunLock:
    """Lock ``folder`` for this process's run (rank-local; rank 0 calls it through
    :meth:`~cadence.checkpoint.run_folder.RunFolder.lock`).

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
                    and alive(holder) and not earlier_attempt(holder)):
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
            same_job = earlier_attempt(holder)
            if not same_job and (holder is None or holder.get("host") != socket.gethostname()):
                raise _refusal(path, holder, "may be running on another host (this "
                                             "filesystem has no file locks to check)") from None
            if not same_job and alive(holder):
                raise _refusal(path, holder, "is running") from None
            _take_over_warning(path, holder)
            path.unlink(missing_ok=True)
            continue
        _write_holder(fd, run_name, token)
        lock = _HELD[str(path)] = RunLock(path, fd, token)
        return lock
    raise SaveFolderInUse(f"Could not create the lock {path}: another run is starting in "
                          f"save_folder {path.parent}.")


# ---------------------------------------------------------------------------- remote
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
        current = _read_remote_holder(self._fs, self._key)
        if current is not None and current.get("token") != self.token:
            log.warning("The lock %s was taken over by %s; this run no longer holds its save "
                        "folder.", self.url, describe(current))
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
            current = _read_remote_holder(self._fs, self._key)
            if current is not None and current.get("token") == self.token:
                self._fs.rm(self._key)
        except Exception as exc:  # noqa: BLE001 - left to go stale
            log.warning("Could not remove the lock %s (%s); it goes stale in %.0f s.",
                        self.url, exc, STALE_SECONDS)


def _read_remote_holder(fs: Any, key: str) -> Optional[dict[str, Any]]:
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


def _create_object(fs: Any, key: str, data: bytes) -> bool:
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
    through :meth:`~cadence.checkpoint.run_folder.RunFolder.lock`).

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
        if _create_object(fs, key, json.dumps(holder).encode()):
            lock = _HELD[url] = RemoteRunLock(url, fs, key, holder)
            return lock
        current = _read_remote_holder(fs, key)
        if current is None:
            continue  # released in between: try again
        age = time.time() - float(current.get("heartbeat", 0))
        dead_here = (current.get("host") == socket.gethostname()
                     and current.get("pid") != os.getpid() and not alive(current))
        if earlier_attempt(current):
            _earlier_attempt_info(join(url, LOCK_FILENAME), current)
            fs.rm(key)
            continue
        if age < STALE_SECONDS and not dead_here:
            raise SaveFolderInUse(
                f"save_folder {url} is in use by {describe(current)}, whose last heartbeat "
                f"was {age:.0f} s ago (a lock is stale after {STALE_SECONDS:.0f} s). Two runs "
                f"in one save folder would overwrite each other's checkpoints. Wait for that "
                f"run to end, or choose another save_folder; if it has ended, delete "
                f"{join(url, LOCK_FILENAME)} or wait {STALE_SECONDS - age:.0f} s.")
        log.warning("Taking over the lock %s of %s, which is no longer running (%s).",
                    join(url, LOCK_FILENAME), describe(current),
                    "its process is gone" if dead_here else f"no heartbeat for {age:.0f} s")
        fs.rm(key)
    raise SaveFolderInUse(f"Could not take the lock {join(url, LOCK_FILENAME)}: another run is "
                          f"starting in save_folder {url}.")


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


#: The lock on a local folder or on a remote one (both have ``held``, ``token``, ``release()``).
AnyRunLock = Union[RunLock, RemoteRunLock]


@atexit.register
def _release_all() -> None:
    for lock in list(_HELD.values()):
        lock.release()
