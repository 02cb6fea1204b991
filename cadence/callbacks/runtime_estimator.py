"""The :class:`RuntimeEstimator` callback: how much training time is left.

Source: MosaicML Composer's ``RuntimeEstimator`` (``composer/callbacks/runtime_estimator.py``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional

from cadence.callbacks.eval_clock import EvalClockCallback
from cadence.registry import callbacks

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["RuntimeEstimator"]

_SECONDS_PER_UNIT = {"seconds": 1.0, "minutes": 60.0, "hours": 3600.0, "days": 86400.0}


@callbacks.register("runtime_estimator")
class RuntimeEstimator(EvalClockCallback):
    """Logs ``time/remaining_estimate``, the estimated training time left, at every
    ``BATCH_END`` once ``skip_batches`` batches of this ``fit`` have run, and its unit as
    the hyperparameter ``time/remaining_estimate_unit`` at ``INIT`` (Composer's names).

    The estimate extrapolates the training rate measured since the skipped batches::

        remaining = (train_seconds / progress) * (1 - elapsed_duration)

    where ``train_seconds`` is the host wall-clock time (``time.perf_counter``) since the
    end of the last skipped batch (since ``FIT_START`` when ``skip_batches`` is 0), minus
    the time spent in evaluation (``EVAL_BEFORE_ALL`` .. ``EVAL_AFTER_ALL``, or
    ``EVAL_START`` .. ``EVAL_END`` when fired alone), ``progress`` is the fraction of
    ``max_duration`` done in that time and ``elapsed_duration`` is
    ``state.get_elapsed_duration()``. The skipped batches (warm-up, compilation, the first
    allocations) are left out of the rate. The estimate covers training only: future
    evaluations are not included. Nothing is logged without a
    ``max_duration``, or while the duration has not moved (e.g. ``max_duration`` in epochs
    with a dataloader of unknown length moves only at epoch ends).

    No device synchronisation is forced; with an asynchronous device the rate settles once
    the host waits on the device (at least whenever a loss is read).

    Args:
        skip_batches: batches at the start of each ``fit`` left out of the rate (default 1).
        time_unit: the unit of the logged value: ``seconds`` (default), ``minutes``,
            ``hours`` or ``days``.

    Raises:
        ValueError: ``skip_batches`` is negative or ``time_unit`` unknown.
    """

    def __init__(self, skip_batches: int = 1, time_unit: str = "seconds") -> None:
        super().__init__()
        if isinstance(skip_batches, bool) or int(skip_batches) != skip_batches or skip_batches < 0:
            raise ValueError(
                f"RuntimeEstimator skip_batches must be an integer >= 0, got {skip_batches!r}."
            )
        if time_unit not in _SECONDS_PER_UNIT:
            raise ValueError(
                f"RuntimeEstimator time_unit {time_unit!r} is not one of "
                f"{', '.join(_SECONDS_PER_UNIT)}."
            )
        self.skip_batches = int(skip_batches)
        self.time_unit = time_unit
        self._divider = _SECONDS_PER_UNIT[time_unit]
        self._batches_this_fit = 0
        self._start_time: Optional[float] = None  # perf_counter at the end of the skipped batches
        self._start_duration = 0.0  # elapsed duration then
        self._eval_seconds_at_start = 0.0

    def init(self, state: State, logger: Any) -> None:
        del state
        logger.log_hyperparameters({"time/remaining_estimate_unit": self.time_unit})

    # -- training clock -------------------------------------------------------------------
    def fit_start(self, state: State, logger: Any) -> None:
        del logger
        self._batches_this_fit = 0
        self._start_time = None
        if self.skip_batches == 0:
            self._start(state, time.perf_counter())

    def batch_start(self, state: State, logger: Any) -> None:
        del logger
        if self.skip_batches == 0 and self._start_time is None:  # no FIT_START (a hand loop)
            self._start(state, time.perf_counter())

    def _start(self, state: State, now: float) -> None:
        """Start the clock now (no-op without a ``max_duration``)."""
        duration = state.get_elapsed_duration()
        if duration is not None:
            self._start_time = now
            self._start_duration = float(duration)
            self._eval_seconds_at_start = self._eval_seconds

    def batch_end(self, state: State, logger: Any) -> None:
        now = time.perf_counter()
        self._batches_this_fit += 1
        if self._start_time is None:
            if self._batches_this_fit >= self.skip_batches:
                self._start(state, now)  # the rate is measured from the end of this batch
            return
        duration = state.get_elapsed_duration()
        if duration is None:
            return
        duration = float(duration)  # a 'dur' Time
        progress = duration - self._start_duration
        if progress <= 0:
            return
        eval_seconds = self._eval_seconds - self._eval_seconds_at_start
        train_seconds = max(0.0, now - self._start_time - eval_seconds)
        remaining = train_seconds / progress * max(0.0, 1.0 - duration)
        logger.log_metrics({"time/remaining_estimate": remaining / self._divider})
