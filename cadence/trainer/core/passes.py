"""Ordering rules for algorithms, as small pure functions.

A pass takes the list of algorithms that matched an event and returns them in the order
to run. Source: Composer's ``composer/core/passes.py``.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

from cadence.trainer.core.event import Event

__all__ = ["AlgorithmPass", "reverse_on_after_events", "DEFAULT_PASSES", "order_algorithms"]

T = TypeVar("T")
AlgorithmPass = Callable[[Sequence[T], Event], Sequence[T]]


def reverse_on_after_events(algorithms: Sequence[T], event: Event) -> Sequence[T]:
    """Run algorithms in reverse on ``AFTER_*`` events, so each undoes its ``BEFORE_*`` work
    in the opposite order (like nested context managers)."""
    if event.is_after_event:
        return list(reversed(algorithms))
    return algorithms


DEFAULT_PASSES: tuple[AlgorithmPass, ...] = (reverse_on_after_events,)


def order_algorithms(
    algorithms: Sequence[T], event: Event, passes: Sequence[AlgorithmPass] = DEFAULT_PASSES
) -> Sequence[T]:
    """Apply each pass in turn to ``algorithms`` for ``event``."""
    for algorithm_pass in passes:
        algorithms = algorithm_pass(algorithms, event)
    return algorithms
