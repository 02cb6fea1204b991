"""The two shapes of a module-surgery algorithm, shared by the algorithms that have them.

* :class:`InitSurgery`: the surgery runs once, at ``Event.INIT`` (before the Trainer wraps or
  shards the model), and changes the model's state-dict keys, so a resumed run must apply it
  again before loading (Composer's ``required_on_load``): ``BlurPool``, ``Factorize``,
  ``SqueezeExcite``, ``GhostBatchNorm``.
* :class:`ApplyAtSurgery`: the surgery runs at ``apply_at``, one of :data:`APPLY_EVENTS`
  (Composer's low-precision norms): ``LowPrecisionLayerNorm``, ``LowPrecisionGroupNorm``.

Each subclass keeps its own arguments, docstring and ``apply``; only the event logic is here.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Union

from cadence.core import Algorithm, Event, State

__all__ = ["APPLY_EVENTS", "ApplyAtSurgery", "InitSurgery", "parse_apply_at"]

#: the events an ``apply_at`` surgery may run at (Composer's)
APPLY_EVENTS = (Event.INIT, Event.BEFORE_LOAD, Event.AFTER_LOAD)


def parse_apply_at(algorithm: str, apply_at: Union[str, Event]) -> Event:
    """``apply_at`` as an Event, one of :data:`APPLY_EVENTS`.

    Raises:
        ValueError: any other event, naming ``algorithm`` and the allowed ones.
    """
    try:
        event = Event(apply_at)
    except ValueError:
        event = None
    if event not in APPLY_EVENTS:
        allowed = ", ".join(e.value for e in APPLY_EVENTS)
        raise ValueError(f"{algorithm}: apply_at={apply_at!r} is not supported; use one of "
                         f"{allowed}.")
    return event


class InitSurgery(Algorithm):
    """An algorithm whose surgery runs at ``Event.INIT`` and must run again on resume."""

    events = frozenset({Event.INIT})

    @staticmethod
    def required_on_load() -> bool:
        """The checkpoint's model has this surgery: a resumed run must apply it too."""
        return True

    def match(self, event: Event, state: State) -> bool:
        return event == Event.INIT


class ApplyAtSurgery(Algorithm):
    """An algorithm that runs ``surgery(model, precision, optimizers)`` at ``apply_at``.

    Args:
        apply_at: ``"init"`` (default), ``"before_load"`` or ``"after_load"`` (an
            :class:`~cadence.core.event.Event` or its value).

    Raises:
        ValueError: ``apply_at`` is another event (naming the algorithm).
        TypeError: from ``apply``, at ``before_load`` / ``after_load`` when the Trainer has
            already wrapped or sharded the model (it does so right after ``INIT``).
    """

    events = frozenset(APPLY_EVENTS)
    #: ``(model, precision, optimizers) -> model``, set by each subclass
    surgery: ClassVar[Callable[..., Any]]

    def __init__(self, apply_at: Event = Event.INIT) -> None:
        self.apply_at = parse_apply_at(type(self).__name__, apply_at)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(apply_at={self.apply_at})"

    def match(self, event: Event, state: State) -> bool:
        return event == self.apply_at

    def apply(self, event: Event, state: State, logger: Any) -> None:
        try:
            type(self).surgery(state.model, state.precision, state.optimizers)
        except TypeError as exc:  # the Trainer parallelizes the model right after INIT
            raise TypeError(f"{self!r}: {exc} Use apply_at='init'.") from None
