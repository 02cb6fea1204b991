"""Restarts after a failure (``cadence launch --max_restarts N``): which attempt this is, why
the previous one ended, and every attempt's first error when the job gives up.

torchrun's agent restarts the whole worker group when a rank fails, up to ``--max_restarts``
times; each new group finds its place through the run file's ``autoresume`` (the newest
verified checkpoint). This module adds what torchrun leaves out:

- :class:`AttemptRecorder` (launcher side): wraps the agent's monitoring so every failed
  attempt's first error is kept (the rank killed by a signal before the ranks that failed
  because of it), tells the next attempt's workers why the previous one ended
  (:data:`REASON_ENV`, inherited from the launcher's environment), and
  :meth:`AttemptRecorder.summary` names each attempt's first error once the job has failed.
- :func:`announce_restart` (worker side, rank 0): ``cadence: restart 1 of 2 after rank 1 was
  killed by SIGKILL (9) ...`` from torchrun's ``TORCHELASTIC_RESTART_COUNT`` and
  ``TORCHELASTIC_MAX_RESTARTS``.

This group's run id and restart count, which the save folder's lock records so that a
restarted group takes over the lock of its own earlier attempt, are read on the worker side
by :func:`cadence.checkpoint.lock.attempt`.

Standard library only (the launcher imports torch's agent itself).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, TextIO

__all__ = ["REASON_ENV", "AttemptRecorder", "announce_restart", "first_error"]

#: Environment variable through which the launcher tells a restarted group why the previous
#: attempt ended.
REASON_ENV = "CADENCE_RESTART_REASON"


def announce_restart(environ: Mapping[str, str] = os.environ,
                     out: TextIO | None = None) -> str | None:
    """On global rank 0 of a restarted group, print ``cadence: restart K of N after REASON``.

    Args:
        environ: the worker's environment (torchrun's ``TORCHELASTIC_RESTART_COUNT``,
            ``TORCHELASTIC_MAX_RESTARTS``, ``RANK``; the launcher's :data:`REASON_ENV`).
        out: where the line goes (default ``sys.stderr``).

    Returns:
        The line printed, or ``None`` (a first attempt, or not rank 0).
    """
    try:
        count = int(environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return None
    if count <= 0 or environ.get("RANK", "0") != "0":
        return None
    limit = environ.get("TORCHELASTIC_MAX_RESTARTS", "?")
    reason = environ.get(REASON_ENV) or "the previous attempt did not finish (a rank failed)"
    line = (f"cadence: restart {count} of {limit} after {reason}; resuming from the newest "
            f"verified checkpoint (autoresume)")
    print(line, file=out or sys.stderr, flush=True)
    return line


def first_error(failures: Mapping[int, Any]) -> str:
    """The first error of one failed attempt, from torchrun's ``{global rank:
    ProcessFailure}``: the earliest, a rank killed by a signal first among equals (the others'
    errors usually follow from it), torchrun's own ``SIGTERM`` to the others last."""
    if not failures:
        return "no rank reported an error"
    # SIGTERM is torchrun stopping the other ranks once one failed: the cause is elsewhere
    rank, failure = min(failures.items(), key=lambda item: (
        int(getattr(item[1], "timestamp", 0) or 0), int(item[1].exitcode) == -signal.SIGTERM,
        int(item[1].exitcode) >= 0, item[0]))
    code = int(failure.exitcode)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"rank {rank} was killed by {name} ({-code})"
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    text = str(message or "").strip()
    line = next((part for part in reversed(text.splitlines())
                 if part.strip() and not part.startswith(" ")), "") if "Traceback" in text \
        else text.splitlines()[0] if text else ""
    if not line or line.startswith("To enable traceback"):
        return f"rank {rank} exited with status {code}"
    return f"rank {rank} exited with status {code}: {line[:300]}"


class AttemptRecorder:
    """Keeps every failed attempt's first error while torchrun's agent runs (launcher side).

    Use as a context manager around ``torch.distributed.run.run``: it wraps
    ``LocalElasticAgent._monitor_workers`` for the duration (restored on exit). Each result
    in a failed state is recorded once per attempt, and :data:`REASON_ENV` is set in this
    process's environment, which the restarted workers inherit.

    Args:
        preemption_exit_codes: exit statuses of a rank that saved and stopped on a
            preemption signal (128 + signal, ``preemption_signals``). An attempt whose every
            failed rank exited with one of these is not a failure: the agent is left no
            restarts (so the launch exits with that status) and :attr:`preempted` is set.
        before_monitor: called at the start of each of the agent's monitor calls, before it
            reaps ended workers (the launcher's :meth:`RankWatcher.check
            <cadence.launch.rank_health.RankWatcher.check>`, which must read a killed
            worker's status before it is reaped).
    """

    def __init__(self, preemption_exit_codes: Iterable[int] = (),
                 before_monitor: Optional[Callable[[], None]] = None) -> None:
        self.errors: list[str] = []
        self.before_monitor = before_monitor
        self.preemption_exit_codes = frozenset(int(code) for code in preemption_exit_codes)
        self.preempted = False
        self._lock = threading.Lock()
        self._original: Any = None

    def _is_preemption(self, failures: Mapping[int, Any]) -> bool:
        return bool(failures) and all(int(getattr(f, "exitcode", 0)) in self.preemption_exit_codes
                                      for f in failures.values())

    def record(self, restart_count: int, failures: Mapping[int, Any]) -> None:
        """Record attempt ``restart_count``'s failure (the first report of it only)."""
        with self._lock:
            if restart_count < len(self.errors):
                return
            error = first_error(failures)
            self.errors.append(error)
            os.environ[REASON_ENV] = f"attempt {restart_count} failed: {error}"

    def __enter__(self) -> AttemptRecorder:
        from torch.distributed.elastic.agent.server.api import WorkerState
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

        original = self._original = LocalElasticAgent._monitor_workers
        recorder = self

        def monitor(agent: Any, worker_group: Any) -> Any:
            if recorder.before_monitor is not None:
                recorder.before_monitor()
            result = original(agent, worker_group)
            if result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY):
                failures = getattr(result, "failures", {}) or {}
                if recorder._is_preemption(failures):  # saved and stopped: not a failure
                    recorder.preempted = True
                    agent._remaining_restarts = 0
                    return result
                spec = worker_group.spec
                recorder.record(spec.max_restarts - agent._remaining_restarts, failures)
            return result

        LocalElasticAgent._monitor_workers = monitor  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

        if self._original is not None:
            LocalElasticAgent._monitor_workers = self._original  # type: ignore[method-assign]
            self._original = None
        os.environ.pop(REASON_ENV, None)

    def lines(self) -> Iterator[str]:
        """``attempt K: ERROR`` for every failed attempt, in order."""
        for index, error in enumerate(self.errors):
            yield f"attempt {index}: {error}"

    def summary(self, max_restarts: int) -> str:
        """What ``cadence launch`` prints when the job has failed: each attempt's first
        error (empty when no attempt was recorded)."""
        if not self.errors:
            return ""
        head = (f"the job failed after {len(self.errors) - 1} restart(s) of --max_restarts "
                f"{max_restarts}" if max_restarts > 0 else "the job failed (--max_restarts 0)")
        return head + "; each attempt's first error:\n" + "\n".join(
            f"  {line}" for line in self.lines())
