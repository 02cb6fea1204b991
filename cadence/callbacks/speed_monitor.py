"""The :class:`SpeedMonitor` callback: training throughput and wall-clock time.

Source: MosaicML Composer's ``SpeedMonitor`` (``composer/callbacks/speed_monitor.py``).
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from cadence.callbacks.eval_clock import EvalClockCallback
from cadence.trainer.dist import get_world_size
from cadence.trainer.registry import callbacks

if TYPE_CHECKING:
    from cadence.trainer.core import State

__all__ = ["SpeedMonitor"]


class _Point(NamedTuple):
    train_seconds: float
    batch: int
    sample: int
    token: int


@callbacks.register("speed_monitor")
class SpeedMonitor(EvalClockCallback):
    """Logs throughput over a sliding window of batches, and the time spent training.

    Time is host wall-clock time (``time.perf_counter``) read at each ``BATCH_END``; no CUDA
    synchronisation is forced, so with an asynchronous device the figures settle once the
    host waits on the device (which it does at least every time a loss is read). Time spent
    in evaluation (``EVAL_BEFORE_ALL`` .. ``EVAL_AFTER_ALL``, or ``EVAL_START`` ..
    ``EVAL_END`` when fired alone) is left out of every figure.

    At every ``BATCH_END`` after the first of a ``fit`` it logs, over the last
    ``window_size`` batches (fewer until that many have run; the first batch's own time,
    which includes warm-up, is never counted):

    - ``throughput/batches_per_sec``: optimizer steps per second.
    - ``throughput/samples_per_sec``: samples per second, all ranks together.
    - ``throughput/device/samples_per_sec``: the same divided by the world size (logged
      only when the world size is above 1).
    - ``throughput/tokens_per_sec`` (and its ``device/`` form, as above): tokens per
      second, only when the run counts tokens (``state.timestamp.token > 0``).

    and at every ``BATCH_END``:

    - ``wall_clock/train``: seconds spent training so far (since ``FIT_START``, eval
      excluded; carried across checkpoint resumption through :meth:`state_dict`).
    - ``wall_clock/eval``: seconds spent in evaluation so far.
    - ``wall_clock/total``: their sum.

    Args:
        window_size: batches to average throughput over (default 20).

    Raises:
        ValueError: ``window_size`` is less than 1.
    """

    def __init__(self, window_size: int = 20) -> None:
        super().__init__()
        if int(window_size) != window_size or window_size < 1:
            raise ValueError(
                f"SpeedMonitor window_size must be an integer >= 1, got {window_size!r}."
            )
        self.window_size = int(window_size)
        # window_size batches elapse between window_size + 1 points.
        self._history: deque[_Point] = deque(maxlen=self.window_size + 1)
        self._train_offset = 0.0  # training seconds from earlier fits / a checkpoint
        self._fit_started_at: Optional[float] = None
        self._eval_seconds_at_fit_start = 0.0

    # -- clock ----------------------------------------------------------------------------
    def _train_seconds(self, now: float) -> float:
        if self._fit_started_at is None:
            return self._train_offset
        eval_in_fit = self.eval_seconds_now(now) - self._eval_seconds_at_fit_start
        return self._train_offset + (now - self._fit_started_at) - eval_in_fit

    def _start_fit_clock(self) -> None:
        self._fit_started_at = time.perf_counter()
        self._eval_seconds_at_fit_start = self._eval_seconds
        self._history.clear()

    # -- events ---------------------------------------------------------------------------
    def fit_start(self, state: State, logger: Any) -> None:
        del state, logger
        self._start_fit_clock()

    def batch_start(self, state: State, logger: Any) -> None:
        del state, logger
        if self._fit_started_at is None:  # FIT_START was not fired (a hand-driven loop)
            self._start_fit_clock()

    def batch_end(self, state: State, logger: Any) -> None:
        now = time.perf_counter()
        if self._fit_started_at is None:
            self._start_fit_clock()
            self._fit_started_at = now
        timestamp = state.timestamp
        train_seconds = self._train_seconds(now)
        self._history.append(_Point(train_seconds, timestamp.batch, timestamp.sample,
                                    timestamp.token))
        metrics: dict[str, float] = {}
        first, last = self._history[0], self._history[-1]
        elapsed = last.train_seconds - first.train_seconds
        if len(self._history) > 1 and elapsed > 0:
            world_size = get_world_size()
            samples_per_sec = (last.sample - first.sample) / elapsed
            metrics["throughput/batches_per_sec"] = (last.batch - first.batch) / elapsed
            metrics["throughput/samples_per_sec"] = samples_per_sec
            if world_size > 1:
                metrics["throughput/device/samples_per_sec"] = samples_per_sec / world_size
            if timestamp.token > 0:
                tokens_per_sec = (last.token - first.token) / elapsed
                metrics["throughput/tokens_per_sec"] = tokens_per_sec
                if world_size > 1:
                    metrics["throughput/device/tokens_per_sec"] = tokens_per_sec / world_size
        eval_seconds = self._eval_seconds
        metrics["wall_clock/train"] = train_seconds
        metrics["wall_clock/eval"] = eval_seconds
        metrics["wall_clock/total"] = train_seconds + eval_seconds
        logger.log_metrics(metrics)

    def fit_end(self, state: State, logger: Any) -> None:
        del state, logger
        now = time.perf_counter()
        self._train_offset = self._train_seconds(now)
        self._fit_started_at = None
        self._history.clear()

    # -- checkpointing --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The training and eval seconds so far, so a resumed run's wall clock continues."""
        return {"train_seconds": self._train_seconds(time.perf_counter()),
                "eval_seconds": self._eval_seconds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the wall clock from a checkpoint (call before ``FIT_START``)."""
        self._train_offset = float(state.get("train_seconds", 0.0))
        self._eval_seconds = float(state.get("eval_seconds", 0.0))
        self._eval_seconds_at_fit_start = self._eval_seconds
        if self._fit_started_at is not None:  # loaded mid-fit: restart the clock from now
            self._fit_started_at = time.perf_counter()
