"""The :class:`Algorithm` base class: something that changes a run at chosen events.

Source: MosaicML Composer's ``Algorithm`` (``composer/core/algorithm.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from cadence.core.event import Event
from cadence.core.serializable import Serializable

if TYPE_CHECKING:
    from cadence.core.state import State

__all__ = ["Algorithm"]


class Algorithm(Serializable, ABC):
    """Base class for algorithms: :meth:`match` says when, :meth:`apply` does it.

    Algorithms may change :class:`~cadence.State` (the model, the gradients, the batch).
    Callbacks may not; they observe.

    Attributes:
        events: the events this algorithm can ever match, or ``None`` for "any". The Engine
            calls :meth:`match` only on these, so an algorithm that names its events costs
            nothing on the others (most algorithms should set it).
    """

    events: ClassVar[Optional[frozenset[Event]]] = None

    @property
    def name(self) -> str:
        """The algorithm's name, used in logs: its class name."""
        return type(self).__name__

    @abstractmethod
    def match(self, event: Event, state: State) -> bool:
        """Whether to run :meth:`apply` on ``event``."""

    @abstractmethod
    def apply(self, event: Event, state: State, logger: Any) -> None:
        """Do the algorithm's work on ``event``; may modify ``state``."""

    def close(self) -> None:
        """Release resources. Called once at the end of a run; must be safe to call twice."""
