"""What the training loop decides once per ``fit`` instead of once per step
(:class:`RunPlan`): the precision context, whether training is done (read once per
timestamp), and when the training loss is logged (:class:`LogSchedule`).

The loss (``loss/train/total`` and the train metrics) is logged every ``log_interval``, in
its unit, by the rule that decides ``save_interval`` and
``eval_interval`` (:func:`~cadence.utils.misc.interval_crossed`), on the first batch, and
when training ends.

- ``ba``: every N batches (N, 2N, ...).
- ``ep`` (or ``iter``): at the end of every Nth epoch, the loss of the epoch's last batch.
- ``dur``: a fraction of ``max_duration`` (``0.25dur`` of 8 batches: batches 2, 4, 6, 8;
  with ``max_duration`` in epochs, counted in batches, rounded up).
- ``sp`` / ``tok`` / ``sec``: on the batch whose sample (token, whole-second) count crosses a
  multiple of N.

A :class:`~cadence.loggers.ConsoleLogger` among the destinations prints the loss it was
given at its own interval (the Trainer's ``console_log_interval``), so the loss is also
logged at that interval: ``console_log_interval='1ba'`` prints it every batch, whatever
``log_interval`` is. The loss stays on the device between logs (no host sync per step).
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Iterable, Optional, Sequence

from cadence.core import State, Time, TimeUnit
from cadence.core.precision import get_precision_context
from cadence.loggers.console_logger import ConsoleLogger
from cadence.utils.misc import interval_crossed

__all__ = ["LogSchedule", "RunPlan"]

_AT_EPOCH_END = (TimeUnit.EPOCH, TimeUnit.ITERATION)


class LogSchedule:
    """The intervals the training loss is logged at (any one due is enough).

    Args:
        intervals: :class:`~cadence.Time` s (``ba``, ``ep``, ``iter``, ``sp``, ``tok``,
            ``sec``, ``dur``); a zero interval never falls due.
    """

    def __init__(self, intervals: Sequence[Time]) -> None:
        self.intervals = list(intervals)
        # batches: a crossing of N is a batch count divisible by N (one batch a step)
        self._every_batches = [int(i.value) for i in self.intervals
                               if i.unit == TimeUnit.BATCH and i.value > 0]
        self._after_batch = [i for i in self.intervals
                             if i.unit not in _AT_EPOCH_END and i.unit != TimeUnit.BATCH]
        self._at_epoch_end = [i for i in self.intervals if i.unit in _AT_EPOCH_END]

    @classmethod
    def for_run(cls, state: State, log_interval: Time,
                destinations: Iterable[Any] = ()) -> LogSchedule:
        """``log_interval`` and the interval of every :class:`ConsoleLogger` in
        ``destinations``.

        Raises:
            ValueError: a ``dur`` interval with ``max_duration`` in epochs and an unsized
                train dataloader (no batch count to take the fraction of).
        """
        intervals = [log_interval]
        key = (log_interval.unit, log_interval.value)
        intervals += [d.log_interval for d in destinations if isinstance(d, ConsoleLogger)
                      and (d.log_interval.unit, d.log_interval.value) != key]
        max_duration = state.max_duration
        if (log_interval.unit == TimeUnit.DURATION and max_duration is not None
                and max_duration.unit == TimeUnit.EPOCH and state.dataloader_len is None):
            raise ValueError(f"log_interval={log_interval} is a fraction of max_duration "
                             f"({max_duration}), which needs a sized train dataloader; give "
                             f"log_interval in batches ('10ba').")
        return cls(intervals)

    def after_batch(self, state: State, batch: int) -> bool:
        """Whether an interval in ``ba``, ``sp``, ``tok``, ``sec`` or ``dur`` ends with the
        batch that just ran (``batch``: the timestamp's batch count after it)."""
        for every in self._every_batches:
            if batch % every == 0:
                return True
        for interval in self._after_batch:
            if interval_crossed(state, interval):
                return True
        return False

    def at_epoch_end(self, state: State) -> bool:
        """Whether an interval in ``ep`` (or ``iter``) ends with the epoch that just ended
        (the timestamp already at the next epoch)."""
        return any(interval_crossed(state, interval) for interval in self._at_epoch_end)


class RunPlan:
    """The per-run decisions of one ``fit``: built at its start, asked at every step.

    Args:
        state: the run's state.
        log_interval: the Trainer's ``log_interval``.
        destinations: the logger destinations (a console's interval is honoured too).
    """

    def __init__(self, state: State, log_interval: Time, destinations: Iterable[Any]) -> None:
        self.log_schedule = LogSchedule.for_run(state, log_interval, destinations)
        self.last_logged_batch = -1  # the batch count the loss was last logged at
        self._precision: Optional[str] = None  # the precision _context was built for
        self._context: ContextManager[None] = contextlib.nullcontext()
        self._done: tuple[Any, Any, bool] = (None, None, False)

    def precision_context(self, state: State) -> ContextManager[None]:
        """The autocast context of ``state.precision`` (a shared ``nullcontext`` for
        ``fp32``), built again only when the precision changes."""
        if state.precision != self._precision:
            self._context = get_precision_context(state.precision, device=state.device)
            self._precision = state.precision
        return self._context

    def training_done(self, state: State) -> bool:
        """Whether ``fit`` stops after this batch: a stop was asked, or the timestamp reached
        ``max_duration`` (compared once per timestamp and ``max_duration``)."""
        if state.stop_training:
            return True
        timestamp, max_duration, reached = self._done
        if timestamp is not state.timestamp or max_duration is not state.max_duration:
            timestamp, max_duration = state.timestamp, state.max_duration
            assert max_duration is not None
            reached = state.reached(max_duration)
            self._done = (timestamp, max_duration, reached)
        return reached

    def log_after_batch(self, state: State, batch: int) -> bool:
        """Whether to log the loss of the batch that just ran (``batch``: the timestamp's
        batch count): the first batch, an interval's end, the end of training."""
        return (batch == 1 or self.log_schedule.after_batch(state, batch)
                or self.training_done(state))

    def log_at_epoch_end(self, state: State) -> bool:
        """Whether to log the loss of the epoch's last batch as the epoch ends: an interval
        in ``ep`` ends, or training does, and that batch's loss was not logged yet."""
        return ((self.log_schedule.at_epoch_end(state) or self.training_done(state))
                and self.last_logged_batch != int(state.timestamp.batch))
