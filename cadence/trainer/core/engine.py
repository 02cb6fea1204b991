"""The :class:`Engine`: the one dispatcher of events.

On each event it runs, in this order: the algorithms whose ``match`` is true (ordered by
the passes in :mod:`~cadence.trainer.core.passes`; reversed on ``AFTER_*`` events), then
the callbacks, then the logger destinations. Source: Composer's ``Engine.run_event``
(``composer/core/engine.py``).

Dispatch is precomputed per event: a callback whose class does not override an event's
method is never called for that event, and an algorithm that names its ``events`` is
never asked to ``match`` others, so an idle callback costs nothing per step.
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any, Sequence

from cadence.trainer.core.algorithm import Algorithm
from cadence.trainer.core.callback import Callback
from cadence.trainer.core.event import Event
from cadence.trainer.core.passes import DEFAULT_PASSES, AlgorithmPass, order_algorithms
from cadence.trainer.core.state import State

__all__ = ["Engine"]


def _overrides(callback: Callback, event: Event) -> bool:
    """Whether ``callback`` does anything on ``event`` (overrides its method or run_event)."""
    cls = type(callback)
    if cls.run_event is not Callback.run_event:
        return True
    return getattr(cls, event.value) is not getattr(Callback, event.value)


class Engine:
    """Runs algorithms, callbacks and logger destinations on each event.

    Args:
        state: the run's :class:`State`; its ``algorithms`` and ``callbacks`` are read once here.
        logger: passed to every ``apply`` and callback method (a :class:`~cadence.Logger`).
        destinations: logger destinations (callbacks too), run after the callbacks.
        passes: algorithm ordering passes; default reverses on ``AFTER_*`` events.
    """

    def __init__(
        self,
        state: State,
        logger: Any,
        destinations: Sequence[Callback] = (),
        passes: Sequence[AlgorithmPass] = DEFAULT_PASSES,
    ) -> None:
        self.state = state
        self.logger = logger
        self.passes = tuple(passes)
        self._closed = False
        self.refresh(destinations)
        ref = weakref.ref(self)
        atexit.register(lambda: (e := ref()) is not None and e.close())

    def refresh(self, destinations: Sequence[Callback] | None = None) -> None:
        """Recompute the per-event dispatch tables (after adding algorithms or callbacks)."""
        if destinations is not None:
            self.destinations = list(destinations)
        algorithms: list[Algorithm] = list(self.state.algorithms)
        observers: list[Callback] = list(self.state.callbacks) + self.destinations
        self._algorithms: dict[Event, list[Algorithm]] = {}
        self._observers: dict[Event, list[Callback]] = {}
        for event in Event:
            candidates = [a for a in algorithms if a.events is None or event in a.events]
            self._algorithms[event] = list(order_algorithms(candidates, event, self.passes))
            self._observers[event] = [c for c in observers if _overrides(c, event)]

    def run_event(self, event: Event) -> None:
        """Fire ``event``: matching algorithms, then callbacks, then logger destinations."""
        state, logger = self.state, self.logger
        for algorithm in self._algorithms[event]:
            if algorithm.match(event, state):
                algorithm.apply(event, state, logger)
        for callback in self._observers[event]:
            callback.run_event(event, state, logger)

    def close(self) -> None:
        """Close every algorithm, callback and destination once. Safe to call again."""
        if self._closed:
            return
        self._closed = True
        errors: list[BaseException] = []
        for obj in [*self.state.algorithms, *self.state.callbacks, *self.destinations]:
            try:
                obj.close()
            except Exception as exc:  # close the rest, then re-raise the first
                errors.append(exc)
        if errors:
            raise errors[0]
