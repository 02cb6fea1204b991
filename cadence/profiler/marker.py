"""The :class:`Marker`: a named span, instant or counter recorded in the profiler's traces.

Source: MosaicML Composer's ``composer.profiler.Marker`` (same methods; made by
``Profiler.marker(name)``).
"""

from __future__ import annotations

import functools
import os
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

from cadence.utils import dist

if TYPE_CHECKING:
    from cadence.core import State
    from cadence.profiler.trace_handler import TraceHandler

__all__ = ["Marker"]


class Marker:
    """Records one named kind of event in the trace handlers, when the schedule says so.

    Use :meth:`start` / :meth:`finish` (or ``with marker:``, or ``@marker`` on a function)
    for a duration, :meth:`instant` for a point in time, :meth:`counter` for values. Make
    markers with :meth:`cadence.profiler.Profiler.marker`, not directly.

    Args:
        state: the run's State (its timestamp goes with each event).
        should_record: ``(state) -> bool``: whether the current batch is recorded.
        trace_handlers: where events go.
        name: the event's name in the trace (``"event/batch_start"``, ``"forward"``).
        record_instant_on_start / record_instant_on_finish: also mark an instant there.
        categories: the trace's categories for the event.
    """

    def __init__(self, state: State, should_record: Callable[[State], bool],
                 trace_handlers: Sequence[TraceHandler], name: str,
                 record_instant_on_start: bool = False, record_instant_on_finish: bool = False,
                 categories: Union[list[str], tuple[str, ...]] = ()) -> None:
        self.state = state
        self.should_record = should_record
        self.trace_handlers = trace_handlers
        self.name = name
        self.record_instant_on_start = record_instant_on_start
        self.record_instant_on_finish = record_instant_on_finish
        self.categories = categories
        self._started = False
        self._recording = False

    def _emit(self, kind: str, **extra: Any) -> None:
        now, rank, pid = time.time_ns(), dist.get_global_rank(), os.getpid()
        for handler in self.trace_handlers:
            method = getattr(handler, f"process_{kind}_event")
            method(name=self.name, categories=self.categories, timestamp=self.state.timestamp,
                   wall_clock_time_ns=now, global_rank=rank, pid=pid, **extra)

    def start(self) -> None:
        """Begin the duration (recorded when the schedule records this batch).

        Raises:
            RuntimeError: the marker is already started.
        """
        if self._started:
            raise RuntimeError(f"Marker {self.name!r} is already started; finish() it first.")
        self._started = True
        self._recording = bool(self.should_record(self.state))
        if self._recording:
            self._emit("duration", is_start=True)
            if self.record_instant_on_start:
                self._emit("instant")

    def finish(self) -> None:
        """End the duration (recorded when its start was).

        Raises:
            RuntimeError: the marker was not started.
        """
        if not self._started:
            raise RuntimeError(f"Marker {self.name!r} was not started; start() it first.")
        self._started = False
        if self._recording:
            self._emit("duration", is_start=False)
            if self.record_instant_on_finish:
                self._emit("instant")
        self._recording = False

    def instant(self) -> None:
        """Record a point in time now (when the schedule records this batch)."""
        if self.should_record(self.state):
            self._emit("instant")

    def counter(self, values: dict[str, Union[float, int]]) -> None:
        """Record counter ``values`` now (when the schedule records this batch)."""
        if self.should_record(self.state):
            self._emit("counter", values=values)

    def __enter__(self) -> Marker:
        self.start()
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 traceback: Optional[TracebackType]) -> None:
        self.finish()

    def __call__(self, func: Optional[Callable[..., Any]] = None) -> Any:
        """``@marker``: record each call of the decorated function as a duration."""
        if func is None:
            return self

        @functools.wraps(func)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return wrapped
