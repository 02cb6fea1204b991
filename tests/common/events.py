"""A callback that records every event it sees, in order."""

from __future__ import annotations

from collections import Counter
from typing import Any

from cadence import Callback, Event, State

__all__ = ["EventCounter"]


class EventCounter(Callback):
    """Records ``events`` (in order) and ``counts`` for every event fired."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.counts: Counter[Event] = Counter()

    def run_event(self, event: Event, state: State, logger: Any) -> None:
        self.events.append(event)
        self.counts[event] += 1
