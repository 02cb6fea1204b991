"""A callback that records every event it sees, in order."""

from __future__ import annotations

from collections import Counter
from typing import Any

from cadence import Callback, Event, State

__all__ = ["EventCounter", "StopAt"]


class EventCounter(Callback):
    """Records ``events`` (in order) and ``counts`` for every event fired."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.counts: Counter[Event] = Counter()

    def run_event(self, event: Event, state: State, logger: Any) -> None:
        self.events.append(event)
        self.counts[event] += 1


class StopAt(Callback):
    """Sets ``state.stop_training`` at the end of batch ``batch`` (1-based, global)."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def batch_end(self, state: State, logger: Any) -> None:
        if state.timestamp.batch == self.batch:
            state.stop_training = True
