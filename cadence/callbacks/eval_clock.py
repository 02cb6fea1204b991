"""``EvalClockCallback``: a callback base that measures the seconds spent in evaluation, so
throughput and time estimates can leave them out."""

from __future__ import annotations

import time
from typing import Any, Optional

from cadence.core import Callback, State

__all__ = ["EvalClockCallback"]


class EvalClockCallback(Callback):
    """Accumulates ``eval_seconds``: wall time (``time.perf_counter``) from
    ``EVAL_BEFORE_ALL`` to ``EVAL_AFTER_ALL`` (or ``EVAL_START`` to ``EVAL_END`` when those
    fire alone). Subclasses call ``super().__init__()`` and read :meth:`eval_seconds_now`."""

    def __init__(self) -> None:
        self._eval_seconds = 0.0  # all eval time so far
        self._eval_started_at: Optional[float] = None
        self._eval_all = False  # inside EVAL_BEFORE_ALL .. EVAL_AFTER_ALL

    def eval_seconds_now(self, now: float) -> float:
        """Eval seconds so far, counting an evaluation still running at ``now``."""
        running = now - self._eval_started_at if self._eval_started_at is not None else 0.0
        return self._eval_seconds + running

    def _start_eval_clock(self) -> None:
        if self._eval_started_at is None:
            self._eval_started_at = time.perf_counter()

    def _stop_eval_clock(self) -> None:
        if self._eval_started_at is not None:
            self._eval_seconds += time.perf_counter() - self._eval_started_at
            self._eval_started_at = None

    def eval_before_all(self, state: State, logger: Any) -> None:
        del state, logger
        self._eval_all = True
        self._start_eval_clock()

    def eval_start(self, state: State, logger: Any) -> None:
        del state, logger
        self._start_eval_clock()

    def eval_end(self, state: State, logger: Any) -> None:
        del state, logger
        if not self._eval_all:
            self._stop_eval_clock()

    def eval_after_all(self, state: State, logger: Any) -> None:
        del state, logger
        self._eval_all = False
        self._stop_eval_clock()
