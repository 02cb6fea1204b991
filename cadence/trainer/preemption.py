"""Checkpoint on a signal: stop at the next batch boundary, save, close, exit ``128 + signal``.

A cluster announces a preemption with a signal ahead of the kill (SLURM: ``SIGTERM``, or
``--signal=USR1@120`` for a warning two minutes ahead; torchrun forwards what its agent
receives). During :meth:`Trainer.fit` a :class:`Preemption` handles the run's
``preemption_signals`` (default ``SIGTERM`` and ``SIGUSR1``; an empty list turns it off):

1. the handler only notes the signal (and starts the ``preemption_timeout`` clock); a second
   signal is logged and ignored, so it cannot interrupt the save;
2. at each batch boundary (after ``BATCH_CHECKPOINT``) every rank asks: with several ranks
   through ONE all-reduce (``MAX``) of a one-number CPU tensor (on a gloo group; beside an
   NCCL default group, a gloo group made once at ``fit`` start), so a signal delivered to one
   rank only stops every rank at the same batch; with one process, no collective;
3. every rank then saves through the run's ``CheckpointSaver`` (atomic, checksummed,
   ``latest`` moved last; with ``save_async`` the save in flight lands first, and this one
   is waited for), runs ``scontrol requeue $SLURM_JOB_ID`` once from rank 0 when
   ``requeue`` is set under SLURM, closes the Trainer (loggers' ``FIT_END``-time cleanup,
   the save folder's lock), and ``fit`` raises :class:`Preempted`; ``cadence train`` maps it
   to exit status ``128 + signum`` (143 for ``SIGTERM``), as a killed job reports;
4. if that has not finished ``preemption_timeout`` seconds after the signal, a watchdog
   thread removes the run's checkpoint temporaries (rank 0; the previous checkpoint stays
   the newest: ``latest`` had not moved) and ends the process at once with ``128 + signum``.

Handlers are installed only while ``fit`` runs, from the main thread, and the previous
handlers are restored when it returns or raises. A signal that arrives after the last batch
boundary lets ``fit`` finish normally (its final checkpoint is the run's end).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, List, NoReturn, Optional

from cadence.registry.errors import ConfigProblem
from cadence.registry.section import Section

if TYPE_CHECKING:
    from cadence.core import State

__all__ = [
    "ALLOWED_SIGNALS", "DEFAULT_SIGNALS", "DEFAULT_TIMEOUT_S", "Preempted", "Preemption",
    "PreemptionConfig",
    "parse_signals", "check_timeout",
]

log = logging.getLogger(__name__)

#: Signals a run may checkpoint on (names as a run file writes them).
ALLOWED_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP")
#: The default ``preemption_signals``.
DEFAULT_SIGNALS = ("SIGTERM", "SIGUSR1")
#: The default ``preemption_timeout``, in seconds (SLURM's KillWait is 30 s: ask for the
#: signal early, ``#SBATCH --signal=USR1@120``).
DEFAULT_TIMEOUT_S = 90.0


class Preempted(Exception):
    """Raised by :meth:`Trainer.fit` after a preemption signal: the run stopped at a batch
    boundary, saved its checkpoint and closed the Trainer. ``cadence train`` exits with
    :attr:`exit_code`.

    Attributes:
        signum: the signal number (``signal.SIGTERM`` is 15).
        exit_code: ``128 + signum``, the status a process killed by the signal reports.
        checkpoint: where the run's newest checkpoint is (None without a save folder).
    """

    def __init__(self, signum: int, checkpoint: Optional[str] = None) -> None:
        self.signum = int(signum)
        self.exit_code = 128 + self.signum
        self.checkpoint = checkpoint
        where = f"checkpoint {checkpoint}" if checkpoint else "no checkpoint (no save_folder)"
        super().__init__(f"Preempted by {signal.Signals(self.signum).name}: stopped at a batch "
                         f"boundary, {where}; exit status {self.exit_code}.")


def parse_signals(value: Any, key: str = "preemption_signals") -> tuple[signal.Signals, ...]:
    """``value`` (names such as ``"SIGTERM"`` or ``"USR1"``, numbers, ``signal.Signals``) as
    signals; an empty list or None: none (checkpointing on a signal off).

    Raises:
        ValueError: a signal not in :data:`ALLOWED_SIGNALS`, or not a list; names ``key``,
            the value and the allowed names.
    """
    if value is None:
        return ()
    if isinstance(value, (str, int)):
        value = [value]
    if not isinstance(value, Iterable):
        raise ValueError(f"{key}: expected a list of signal names such as "
                         f"{list(DEFAULT_SIGNALS)} ([] turns it off), got {value!r}.")
    signals = []
    for item in value:
        name = item.name if isinstance(item, signal.Signals) else (
            f"SIG{str(item).upper().removeprefix('SIG')}" if isinstance(item, str) else None)
        if isinstance(item, int) and not isinstance(item, (bool, signal.Signals)):
            name = next((s.name for s in signal.Signals if s.value == item), None)
        if name not in ALLOWED_SIGNALS:
            raise ValueError(f"{key}: {item!r} is not a signal cadence checkpoints on; use some "
                             f"of {list(ALLOWED_SIGNALS)} (default {list(DEFAULT_SIGNALS)}; [] "
                             f"turns it off).")
        if getattr(signal, name) not in signals:
            signals.append(getattr(signal, name))
    return tuple(signals)


def check_timeout(value: Any, key: str = "preemption_timeout") -> float:
    """``value`` as a positive number of seconds.

    Raises:
        ValueError: not a number > 0; names ``key``, the value and the default.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{key}: {value!r} must be a positive number of seconds (default "
                         f"{DEFAULT_TIMEOUT_S:g}); it bounds the time from the signal to the "
                         f"exit.")
    return float(value)


@dataclass
class PreemptionConfig(Section):
    """What the run does on a preemption signal: checkpoint at the next batch, close, exit.

    Attributes:
        preemption_signals: the signals (names such as ``"SIGTERM"`` or ``"USR1"``, numbers,
            ``signal.Signals``) on which every rank stops at the next batch, saves a
            checkpoint, closes, and ``fit`` raises :class:`Preempted` (``cadence train`` exits
            with ``128 + signal``); of :data:`ALLOWED_SIGNALS`; default ``[SIGTERM,
            SIGUSR1]``; ``[]`` (or None): off.
        preemption_timeout: seconds from the signal to the exit, at most (default 90); a save
            not done by then is abandoned (the previous checkpoint stays the newest).
        requeue: under SLURM, after the save, rank 0 runs ``scontrol requeue $SLURM_JOB_ID``.

    Raises:
        ConfigError: a signal cadence does not checkpoint on, a timeout that is not a
            positive number (naming the key).
    """

    preemption_signals: Optional[List[str]] = field(
        default_factory=lambda: list(DEFAULT_SIGNALS), metadata={"python_type": Any})
    preemption_timeout: float = DEFAULT_TIMEOUT_S
    requeue: bool = False

    def problems(self) -> list[ConfigProblem]:
        found = []
        for key, check in (("preemption_signals", parse_signals),
                           ("preemption_timeout", check_timeout)):
            try:
                check(getattr(self, key), key)
            except ValueError as exc:
                found.append(ConfigProblem(key, str(exc).partition(": ")[2]))
        return found


class Preemption:
    """The signal handling of one Trainer (see the module docstring).

    Args:
        signals: what :func:`parse_signals` takes; empty: off.
        timeout: seconds from the signal to the exit, at most (:func:`check_timeout`).
        requeue: after the save, rank 0 runs ``scontrol requeue $SLURM_JOB_ID`` (once) when
            ``SLURM_JOB_ID`` is set.

    Raises:
        ValueError: a bad argument, naming it.
    """

    def __init__(self, signals: Any = DEFAULT_SIGNALS, timeout: float = DEFAULT_TIMEOUT_S,
                 requeue: bool = False) -> None:
        self.signals = parse_signals(signals)
        self.timeout = check_timeout(timeout)
        self.requeue = bool(requeue)
        self.signum: Optional[int] = None  # the first signal received (or agreed)
        self._deadline: Optional[float] = None  # time.monotonic() by which the process ends
        self._watchdog: Optional[threading.Timer] = None
        self._saved = False  # the checkpoint is complete: the watchdog removes nothing
        self._cleanup: Callable[[], None] = lambda: None  # removes the save's temporaries
        self._group: Any = None  # the CPU (gloo) group of the per-batch all-reduce
        self._requeued = False

    @contextmanager
    def watch(self, state: State) -> Iterator[None]:
        """Handle the signals while the block (``fit``'s loop) runs; restore the previous
        handlers after it. Off (no handlers) with no signals, or outside the main thread."""
        if not self.signals:
            yield
            return
        if threading.current_thread() is not threading.main_thread():
            log.warning("fit() runs outside the main thread: preemption_signals are not "
                        "handled (Python installs signal handlers from the main thread only).")
            yield
            return
        self._cleanup = lambda: _remove_temporaries(state)
        self._group = _cpu_group()
        previous = {sig: signal.signal(sig, self._handle) for sig in self.signals}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self._watchdog is not None:
                self._watchdog.cancel()

    def _handle(self, signum: int, frame: Any) -> None:
        del frame
        if self.signum is not None:
            log.warning("Received %s while stopping for %s: ignored (the checkpoint is being "
                        "written).", signal.Signals(signum).name,
                        signal.Signals(self.signum).name)
            return
        self.signum = signum
        self._start_clock()
        log.warning("Received %s: stopping at the next batch boundary to save a checkpoint "
                    "(at most %gs).", signal.Signals(signum).name, self.timeout)

    def _start_clock(self) -> None:
        """Start the watchdog: ``timeout`` seconds from now the process ends."""
        if self._watchdog is not None:
            return
        self._deadline = time.monotonic() + self.timeout
        self._watchdog = threading.Timer(self.timeout, self._expire)
        self._watchdog.daemon = True
        self._watchdog.start()

    def _expire(self) -> None:
        """The deadline passed: remove the unfinished save's temporaries, end the process."""
        assert self.signum is not None
        if not self._saved:
            try:
                self._cleanup()
            except OSError as exc:
                log.error("Removing the unfinished checkpoint's temporaries failed: %s", exc)
        log.error("preemption_timeout (%gs) ran out %s; exiting with status %d.", self.timeout,
                  "after the checkpoint was saved" if self._saved else
                  "before the checkpoint was saved: the previous checkpoint stays the newest",
                  128 + self.signum)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(128 + self.signum)

    def requested(self) -> Optional[int]:
        """Whether to stop now (call at every batch boundary, on every rank): the signal
        number, or None. With several ranks, one all-reduce (``MAX``) of the flag."""
        if not self.signals:
            return None
        if self._group is not None:
            import torch
            import torch.distributed as torch_dist

            flag = torch.tensor([self.signum or 0], dtype=torch.int32)
            torch_dist.all_reduce(flag, op=torch_dist.ReduceOp.MAX, group=self._group)
            agreed = int(flag.item())
            if agreed and self.signum is None:  # another rank got it
                self.signum = agreed
                self._start_clock()
                log.warning("Another rank received %s: stopping at this batch boundary.",
                            signal.Signals(agreed).name)
            return agreed or None  # not self.signum: a signal during the all-reduce waits
        return self.signum

    def stop(self, state: State, logger: Any, close: Callable[[], None]) -> NoReturn:
        """Save, requeue (``requeue``, rank 0), close the Trainer, raise :class:`Preempted`.

        Raises:
            Preempted: always, once the checkpoint is complete and the Trainer closed.
        """
        from cadence.trainer.checkpointing import run_saver
        from cadence.utils import dist

        assert self.signum is not None
        started = time.monotonic()
        saver = run_saver(state.callbacks)
        checkpoint: Optional[str] = None
        if saver is None:
            log.warning("Preempted at batch %d without a save_folder: no checkpoint.",
                        int(state.timestamp.batch))
        else:
            saver.wait()  # a background save in flight lands first
            saver.save(state, logger)  # nothing when this batch was just saved
            saver.wait()
            kept = saver.saved_checkpoints
            checkpoint = kept[-1] if kept else None
        self._saved = True
        log.warning("Preempted at batch %d: checkpoint %s saved in %.1fs.",
                    int(state.timestamp.batch), checkpoint, time.monotonic() - started)
        if self.requeue and dist.get_global_rank() == 0:
            self._requeue()
        close()
        if self._watchdog is not None:
            self._watchdog.cancel()
        raise Preempted(self.signum, checkpoint)

    def _requeue(self) -> None:
        """``scontrol requeue $SLURM_JOB_ID``, once; a failure is logged, not raised."""
        if self._requeued:
            return
        self._requeued = True
        job = os.environ.get("SLURM_JOB_ID")
        if not job:
            log.warning("requeue: true, but SLURM_JOB_ID is not set (not a SLURM job): "
                        "nothing requeued.")
            return
        left = 30.0 if self._deadline is None else max(1.0, self._deadline - time.monotonic())
        try:
            done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True,
                                  timeout=left)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.error("scontrol requeue %s failed: %s", job, exc)
            return
        if done.returncode != 0:
            log.error("scontrol requeue %s failed (status %d): %s", job, done.returncode,
                      done.stderr.strip())
        else:
            log.warning("Requeued SLURM job %s.", job)


def _cpu_group() -> Any:
    """The group of the per-batch all-reduce: None with one process; the default group when
    it is gloo; else a gloo group of every rank, made once (a collective: every rank calls
    ``fit``). A CPU tensor, so the check never waits for the GPU."""
    import torch.distributed as torch_dist

    if not (torch_dist.is_available() and torch_dist.is_initialized()) \
            or torch_dist.get_world_size() <= 1:
        return None
    if torch_dist.get_backend() == "gloo":
        return torch_dist.group.WORLD
    return torch_dist.new_group(backend="gloo")


def _remove_temporaries(state: State) -> None:
    """Rank 0 removes the run's checkpoint temporaries in its local save folder."""
    from pathlib import Path

    from cadence.checkpoint.files import pointer_name, remove_stale_temporaries
    from cadence.utils import dist

    if state.save_folder is None or dist.get_global_rank() != 0:
        return
    from cadence.trainer.checkpointing import run_saver

    saver = run_saver(state.callbacks)
    latest = pointer_name(saver.latest_filename if saver else None, state.run_name)
    for path in remove_stale_temporaries(Path(state.save_folder), state.run_name, latest):
        log.warning("Removed %s (an unfinished checkpoint).", path)

