"""Keep the ranks of a launch tied together: they die with their launcher, and a rank that
is killed or stops answering is named.

Three pieces, each small:

- :func:`die_with_launcher` (worker side, called by ``cadence train`` when torchrun started
  it): torchrun starts every worker in its own session, so a ``SIGKILL`` on the launcher
  leaves the workers running (and writing checkpoints that race a relaunch). Each worker
  asks Linux to ``SIGKILL`` it when its parent dies (``prctl(PR_SET_PDEATHSIG)``), then
  checks that the parent is still the launcher, in case it died before the call.
- :func:`report_collective_failure` (worker side, called by ``cadence train`` when ``fit``
  raised): a rank that failed in its own code records its error in the launcher's
  key-value store; after a collective failed (the process group's ``dist_timeout`` ran
  out, or a peer's connection closed), every surviving rank records that it is alive and
  waits a few seconds for the others, then names on stderr, before its traceback, the
  ranks that never answered (stopped, hung, dead) and those that failed (with their error).
- :class:`RankWatcher` (launcher side, a thread of ``cadence launch``): watches the worker
  processes through ``/proc``; a rank killed by a signal is named with its signal at once
  (before the survivors' gloo errors), and once the job has failed, a rank that is stopped
  (``SIGSTOP``) is named and killed, since it can never handle torchrun's ``SIGTERM``.

Linux only (``prctl``, ``/proc``); elsewhere each piece does nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Optional, TextIO

import torch.distributed as torch_dist

__all__ = [
    "LAUNCHER_PID_ENV", "ANSWER_WAIT_S", "die_with_launcher", "is_collective_failure",
    "peer_answers", "report_collective_failure", "RankWatcher",
]

#: Environment variable through which ``cadence launch`` tells its workers its PID.
LAUNCHER_PID_ENV = "CADENCE_LAUNCHER_PID"
#: Seconds a rank waits, after a collective failed, for the other ranks to answer.
ANSWER_WAIT_S = 3.0

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_IS_LINUX = sys.platform.startswith("linux")


def die_with_launcher() -> None:
    """Have the kernel ``SIGKILL`` this process when its parent (the torchrun agent, i.e. the
    ``cadence launch`` process) dies, then exit at once if the parent is already gone.

    "Gone" means: the parent PID differs from ``$CADENCE_LAUNCHER_PID`` when the launcher set
    it, else the process was re-parented to PID 1. A no-op outside Linux.

    Raises:
        SystemExit: the launcher died before this process could tie itself to it (status 1).
    """
    if not _IS_LINUX:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        print(f"cadence: prctl(PR_SET_PDEATHSIG) failed ({os.strerror(errno)}); this rank will "
              f"not die with its launcher.", file=sys.stderr, flush=True)
        return
    expected = os.environ.get(LAUNCHER_PID_ENV)
    parent = os.getppid()
    if (expected is not None and expected.isdigit() and parent != int(expected)) or parent == 1:
        raise SystemExit(f"cadence: the launcher (pid {expected or 'unknown'}) exited before "
                         f"this rank (pid {os.getpid()}) started; exiting too.")


def is_collective_failure(exc: BaseException) -> bool:
    """Whether ``exc`` comes from a failed collective or process-group connection (a timeout,
    or a peer that closed its connection), as opposed to an error in the user's code."""
    if isinstance(exc, getattr(torch_dist, "DistError", ())):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc)
    return any(mark in text for mark in (
        "gloo", "Gloo", "NCCL", "Timed out", "timed out", "Connection closed", "Connection reset",
    ))


def _answers_key(rank: int) -> str:
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"cadence/answered/{attempt}/{rank}"


def peer_answers(own_answer: str, wait_s: float = ANSWER_WAIT_S) -> Optional[dict[int, str]]:
    """Tell the other ranks how this one ended, and hear how they did, after a failure.

    This rank sets ``cadence/answered/<rank>`` to ``own_answer`` in the process group's store
    (with torchrun, the launcher's), then, when ``wait_s > 0``, polls for the other ranks'
    keys for up to ``wait_s`` seconds. Every survivor of a failed collective calls it at
    about the same time, and a rank that failed in its own code answers before it exits,
    so a rank whose key never appears is stopped, hung in something else, or dead.

    Args:
        own_answer: how this rank ended, one line (e.g. ``"failed: RuntimeError: ..."``).
        wait_s: seconds to wait for the other ranks (default 3); 0: only answer.

    Returns:
        ``{rank: answer}`` for every other rank that answered (the silent ones are missing),
        or ``None`` without a process group of several ranks or a reachable store.
    """
    if not (torch_dist.is_available() and torch_dist.is_initialized()):
        return None
    world_size, rank = torch_dist.get_world_size(), torch_dist.get_rank()
    if world_size <= 1:
        return None
    answers: dict[int, str] = {}
    try:
        store = torch_dist.distributed_c10d._get_default_store()
        store.set(_answers_key(rank), own_answer)
        waiting = [r for r in range(world_size) if r != rank]
        deadline = time.monotonic() + wait_s
        while waiting and time.monotonic() < deadline:
            time.sleep(0.1)
            for other in [r for r in waiting if store.check([_answers_key(r)])]:
                answers[other] = store.get(_answers_key(other)).decode(errors="replace")
                waiting.remove(other)
    except Exception:  # noqa: BLE001 - the store went down with the job: nothing to hear
        return None
    return answers


def report_collective_failure(exc: BaseException, dist_timeout: float) -> None:
    """After ``exc`` ended ``fit()`` on this rank of a multi-rank run: a failed collective
    prints to stderr which ranks did not answer, or how they failed (see
    :func:`peer_answers`), so the launch output names them before this rank's traceback;
    any other error is only recorded for the other ranks to name.

    Args:
        exc: the exception that ended ``fit()`` on this rank.
        dist_timeout: the process group's timeout in seconds (for the message).
    """
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    summary = f"{type(exc).__name__}: {first}"[:300]
    if not is_collective_failure(exc):
        peer_answers(f"failed with {summary}", wait_s=0)
        return
    answers = peer_answers("its collective failed too")
    if answers is None:
        return
    rank, world_size = torch_dist.get_rank(), torch_dist.get_world_size()
    silent = [r for r in range(world_size) if r != rank and r not in answers]
    failed = {r: a for r, a in answers.items() if a.startswith("failed")}
    parts = [f"rank {r} {answer}" for r, answer in sorted(failed.items())]
    if silent:
        names = ", ".join(str(r) for r in silent)
        parts.append(f"rank{'s' if len(silent) > 1 else ''} {names} did not answer")
    who = "; ".join(parts) or "every other rank's collective failed too"
    print(f"cadence: rank {rank}: a collective failed ({summary}); {who} (dist_timeout is "
          f"{dist_timeout:g} s; a rank that is stopped, hung or dead stalls every collective).",
          file=sys.stderr, flush=True)


class RankWatcher(threading.Thread):
    """Launcher-side watch over the workers (the launcher's child processes that have a
    ``RANK`` in their environment), polled through ``/proc`` every ``interval`` seconds.

    - A worker killed by a signal while the others still ran is reported at once:
      ``rank 1 (pid 4242) was killed by SIGKILL``. Its exit status is read with
      ``waitid(WNOWAIT)``, which leaves the process for torchrun to reap. (Signals after a
      first worker ended are torchrun stopping the rest, and are not reported.)
    - Once any worker has failed (or ended with a status torchrun reaped first), a worker
      that is stopped (``SIGSTOP``; it cannot handle ``SIGTERM``, so torchrun would wait 30 s
      for it) is reported and killed with ``SIGKILL``.

    Args:
        out: where reports go (default ``sys.stderr``).
        interval: seconds between polls (default 0.05).
    """

    def __init__(self, out: Optional[TextIO] = None, interval: float = 0.05) -> None:
        super().__init__(name="cadence-rank-watcher", daemon=True)
        self._out = out
        self._interval = interval
        self._halt = threading.Event()
        self._ranks: dict[int, str] = {}
        self._done: set[int] = set()
        self._ended = False  # a worker has ended: later signals may be torchrun's shutdown
        self._failed = False
        self._lock = threading.Lock()  # the thread's polls and check() from torchrun's monitor

    def stop(self) -> None:
        """End the watch (returns once the thread has stopped)."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)

    def run(self) -> None:  # noqa: D102 - threading.Thread's
        if not _IS_LINUX:
            return
        while not self._halt.is_set():
            self.check()
            self._halt.wait(self._interval)

    def check(self) -> None:
        """Look at the workers now (what each poll does). torchrun's monitor calls it before
        it reaps the workers (:class:`~cadence.launch.restarts.AttemptRecorder`'s
        ``before_monitor``), so a rank killed by a signal is named even when this thread was
        not scheduled in time on a busy machine: after the reap its status is gone."""
        if not _IS_LINUX:
            return
        with self._lock:
            try:
                self._discover()
                self._poll()
            except Exception:  # noqa: BLE001 - a watcher must never take the launch down
                pass

    def _say(self, text: str) -> None:
        out = self._out or sys.stderr
        print(f"cadence launch: {text}", file=out, flush=True)

    def _discover(self) -> None:
        for children in Path("/proc/self/task").glob("*/children"):
            for pid in (int(p) for p in children.read_text().split()):
                if pid in self._ranks:
                    continue
                rank = _environ_rank(pid)
                if rank is not None:
                    self._ranks[pid] = rank

    def _poll(self) -> None:
        stopped = []
        # Ranks that ended by SIGTERM are looked at last: when a rank is killed, torchrun
        # SIGTERMs the others at once, and both may be seen in one poll; the first failure
        # is the kill, not torchrun's stop.
        for pid, rank in sorted(self._ranks.items(), key=lambda item: _ended_by_sigterm(item[0])):
            if pid in self._done:
                continue
            state = _proc_state(pid)
            if state is None:  # reaped by torchrun before its status was seen: a failure
                self._done.add(pid)  # as far as a stopped rank is concerned (see _poll)
                self._ended = self._failed = True
            elif state == "Z" and self._exited(pid, rank):
                self._done.add(pid)
                self._ended = True
            elif state in ("T", "t"):
                stopped.append((pid, rank))
        if self._failed:
            for pid, rank in stopped:
                self._say(f"rank {rank} (pid {pid}) is stopped (SIGSTOP or a debugger) and did "
                          f"not answer; killing it so the launch can end.")
                self._done.add(pid)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _exited(self, pid: int, rank: str) -> bool:
        """Report how worker ``pid`` ended; ``False`` when its status is not readable yet (a
        multi-threaded process shows ``Z`` before its last thread has gone)."""
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        except ChildProcessError:
            return True  # reaped by torchrun meanwhile
        if info is None:
            return False
        if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
            self._failed = True
            if self._ended:
                return True  # torchrun stopping the others after the first one ended
            try:
                name = signal.Signals(info.si_status).name
            except ValueError:
                name = f"signal {info.si_status}"
            self._say(f"rank {rank} (pid {pid}) was killed by {name} ({info.si_status}); the "
                      f"other ranks' errors below follow from it.")
        elif info.si_status != 0:
            self._failed = True
        return True


def _ended_by_sigterm(pid: int) -> bool:
    """Whether child ``pid`` has ended, killed by ``SIGTERM`` (peeked: the status stays for
    torchrun to reap)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
    except ChildProcessError:
        return False
    return info is not None and info.si_code == os.CLD_KILLED \
        and info.si_status == signal.SIGTERM


def _environ_rank(pid: int) -> Optional[str]:
    """The ``RANK`` in a worker's environment; ``None`` for other processes."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    values = dict(item.split(b"=", 1) for item in environ if b"=" in item)
    if b"TORCHELASTIC_RUN_ID" not in values or b"RANK" not in values:
        return None
    return values[b"RANK"].decode()


def _proc_state(pid: int) -> Optional[str]:
    """The state letter of ``/proc/<pid>/stat`` (``R``, ``S``, ``T``, ``Z``...), or ``None``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split(" ", 1)[0]

