from __future__ import annotations

from typing import Any

import pytest
import torch

from cadence import Algorithm, Callback, Engine, Event, State
from cadence.trainer.core.passes import reverse_on_after_events


class Recorder(Algorithm):
    def __init__(self, name: str, calls: list[str]) -> None:
        self._name, self.calls = name, calls

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.BEFORE_FORWARD, Event.AFTER_FORWARD)

    def apply(self, event: Event, state: State, logger: Any) -> None:
        self.calls.append(f"{self._name}:{event.value}")


class OnlyBatchEnd(Callback):
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        self.closed = 0

    def batch_end(self, state: State, logger: Any) -> None:
        self.calls.append("callback:batch_end")

    def close(self) -> None:
        self.closed += 1


def make_engine(calls: list[str]) -> tuple[Engine, OnlyBatchEnd]:
    cb = OnlyBatchEnd(calls)
    state = State(model=torch.nn.Linear(1, 1), algorithms=[Recorder("a", calls), Recorder("b", calls)],
                  callbacks=[cb])
    return Engine(state, logger=None), cb


def test_algorithms_reverse_on_after_events() -> None:
    calls: list[str] = []
    engine, _ = make_engine(calls)
    engine.run_event(Event.BEFORE_FORWARD)
    engine.run_event(Event.AFTER_FORWARD)
    assert calls == ["a:before_forward", "b:before_forward", "b:after_forward", "a:after_forward"]


def test_algorithms_before_callbacks_before_destinations() -> None:
    calls: list[str] = []

    class Dest(Callback):
        def batch_end(self, state: State, logger: Any) -> None:
            calls.append("destination:batch_end")

    class AlgoOnBatchEnd(Algorithm):
        def match(self, event: Event, state: State) -> bool:
            return event == Event.BATCH_END

        def apply(self, event: Event, state: State, logger: Any) -> None:
            calls.append("algorithm:batch_end")

    state = State(model=torch.nn.Linear(1, 1), algorithms=[AlgoOnBatchEnd()],
                  callbacks=[OnlyBatchEnd(calls)])
    Engine(state, logger=None, destinations=[Dest()]).run_event(Event.BATCH_END)
    assert calls == ["algorithm:batch_end", "callback:batch_end", "destination:batch_end"]


def test_callbacks_without_an_override_are_not_dispatched() -> None:
    calls: list[str] = []
    engine, cb = make_engine(calls)
    assert engine._observers[Event.BATCH_START] == []
    assert engine._observers[Event.BATCH_END] == [cb]


def test_declared_events_limit_match_calls() -> None:
    seen: list[Event] = []

    class Declared(Algorithm):
        events = frozenset({Event.FIT_START})

        def match(self, event: Event, state: State) -> bool:
            seen.append(event)
            return False

        def apply(self, event: Event, state: State, logger: Any) -> None:
            raise AssertionError("never matches")

    engine = Engine(State(model=torch.nn.Linear(1, 1), algorithms=[Declared()]), logger=None)
    for event in Event:
        engine.run_event(event)
    assert seen == [Event.FIT_START]


def test_close_is_idempotent_and_closes_everything_once() -> None:
    calls: list[str] = []
    engine, cb = make_engine(calls)
    engine.close()
    engine.close()
    assert cb.closed == 1


def test_close_runs_every_close_then_raises_the_first_error() -> None:
    class Broken(Callback):
        def close(self) -> None:
            raise RuntimeError("broken close")

    calls: list[str] = []
    cb = OnlyBatchEnd(calls)
    engine = Engine(State(model=torch.nn.Linear(1, 1), callbacks=[Broken(), cb]), logger=None)
    with pytest.raises(RuntimeError, match="broken close"):
        engine.close()
    assert cb.closed == 1


def test_reverse_pass_is_pure() -> None:
    algos = [1, 2, 3]
    assert list(reverse_on_after_events(algos, Event.AFTER_LOSS)) == [3, 2, 1]
    assert list(reverse_on_after_events(algos, Event.BEFORE_LOSS)) == [1, 2, 3]
    assert list(reverse_on_after_events(algos, Event.EVAL_AFTER_FORWARD)) == [3, 2, 1]
    assert algos == [1, 2, 3]
