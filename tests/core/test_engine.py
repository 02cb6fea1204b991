from __future__ import annotations

from typing import Any

import pytest
import torch

from cadence import Algorithm, Callback, Engine, Event, State
from cadence.core.passes import reverse_on_after_events


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
    assert engine._callbacks[Event.BATCH_START] == []
    assert engine._callbacks[Event.BATCH_END] == [cb]


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


class DuckAlgorithm:
    """An algorithm with only match/apply (no base class, no ``events``), as Composer allows."""

    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.INIT, Event.BEFORE_LOSS, Event.AFTER_LOSS)

    def apply(self, event: Event, state: State, logger: Any) -> int:
        self.calls.append(f"{self.name}:{event.value}")
        return 7

    def __repr__(self) -> str:
        return self.name


def test_duck_typed_algorithms_run_and_are_traced() -> None:
    calls: list[str] = []
    class X(DuckAlgorithm):
        pass

    class Y(DuckAlgorithm):
        pass

    state = State(model=torch.nn.Linear(1, 1), algorithms=[X("x", calls), Y("y", calls)])
    engine = Engine(state, logger=None)
    engine.run_event(Event.BEFORE_LOSS)
    traces = engine.run_event("after_loss")  # Composer also takes the event's value
    assert calls == ["x:before_loss", "y:before_loss", "y:after_loss", "x:after_loss"]
    assert list(traces) == ["Y/AFTER_LOSS", "X/AFTER_LOSS"]
    assert [(t.name, t.order, t.exit_code, t.run, t.event) for t in traces.values()] == [
        ("Y", 0, 7, True, Event.AFTER_LOSS), ("X", 1, 7, True, Event.AFTER_LOSS)]
    assert engine.run_event(Event.BATCH_END) == {}


def test_init_runs_logger_destinations_first_then_callbacks_then_algorithms() -> None:
    calls: list[str] = []

    class Dest(Callback):
        def init(self, state: State, logger: Any) -> None:
            calls.append("destination:init")

    class Cb(Callback):
        def init(self, state: State, logger: Any) -> None:
            calls.append("callback:init")

    state = State(model=torch.nn.Linear(1, 1), algorithms=[DuckAlgorithm("algo", calls)],
                  callbacks=[Cb()])
    Engine(state, logger=None, destinations=[Dest()]).run_event(Event.INIT)
    assert calls == ["destination:init", "callback:init", "algo:init"]


def test_run_event_after_close_raises() -> None:
    calls: list[str] = []
    engine, _ = make_engine(calls)
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.run_event(Event.BATCH_END)
    assert calls == []


def test_close_takes_composers_signature_and_post_close() -> None:
    seen: list[str] = []

    class ComposerStyle(Callback):
        def close(self, state: State, logger: Any) -> None:  # type: ignore[override]
            seen.append(f"close:{type(state).__name__}")

        def post_close(self) -> None:
            seen.append("post_close")

    engine = Engine(State(model=torch.nn.Linear(1, 1), callbacks=[ComposerStyle()]), logger=None)
    engine.close()
    assert seen == ["close:State", "post_close"]


def test_register_pass_and_algorithm_passes() -> None:
    calls: list[str] = []
    algos = [DuckAlgorithm("a", calls), DuckAlgorithm("b", calls), DuckAlgorithm("c", calls)]

    def c_first(algorithms: Any, event: Event) -> Any:
        return sorted(algorithms, key=lambda a: a.name != "c")

    def drop_b(algorithms: Any, event: Event) -> Any:
        return [a for a in algorithms if a.name != "b"]

    engine = Engine(State(model=torch.nn.Linear(1, 1), algorithms=algos), logger=None,
                    algorithm_passes=[c_first, (drop_b, 0)])
    assert engine.algorithm_passes[0] is drop_b and engine.algorithm_passes[-1] is c_first
    engine.run_event(Event.BEFORE_LOSS)
    assert calls == ["c:before_loss", "a:before_loss"]
    calls.clear()
    engine.register_pass(lambda algorithms, event: list(reversed(algorithms)))
    engine.run_event(Event.BEFORE_LOSS)
    assert calls == ["a:before_loss", "c:before_loss"]
    with pytest.raises(ValueError, match="algorithm_passes"):
        Engine(State(model=torch.nn.Linear(1, 1)), logger=None, algorithm_passes=[42])


def test_trainer_takes_algorithm_passes() -> None:
    from cadence import Trainer
    from tests.common.models import SimpleModel, make_dataloader

    calls: list[str] = []
    first, second = DuckAlgorithm("first", calls), DuckAlgorithm("second", calls)

    def second_first(algorithms: Any, event: Event) -> Any:
        return sorted(algorithms, key=lambda a: a is not second)

    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=1),
                      max_duration="1ba", algorithms=[first, second],
                      algorithm_passes=second_first, progress_bar=False, device="cpu", seed=0)
    trainer.fit()
    trainer.close()
    assert calls[:2] == ["second:init", "first:init"]
    assert "second:before_loss" in calls
    assert calls.index("second:before_loss") < calls.index("first:before_loss")


class _IsClosed(Callback):
    """Composer's ``IsClosedCallback``: open from ``INIT`` until ``close``."""

    def __init__(self) -> None:
        self.is_closed = True

    def init(self, state: State, logger: Any) -> None:
        assert self.is_closed
        self.is_closed = False

    def close(self, state: State, logger: Any) -> None:  # type: ignore[override]
        self.is_closed = True


def test_an_engine_closes_its_callbacks_when_dropped_and_only_once() -> None:
    import gc
    import sys

    callback = _IsClosed()
    state = State(model=torch.nn.Linear(1, 1), callbacks=[callback])
    engine = Engine(state, logger=None)
    engine.run_event(Event.INIT)
    assert sys.getrefcount(engine) == 2  # nothing else holds it (atexit keeps a weak ref)
    del engine
    gc.collect()
    assert callback.is_closed
    engine = Engine(state, logger=None)  # the callback is closed: may be reused
    engine.run_event(Event.INIT)
    engine.close()
    engine = Engine(state, logger=None)  # the closed engine goes away: no second close
    engine.run_event(Event.INIT)
    assert not callback.is_closed
    engine.close()


def test_a_callback_still_open_in_another_engine_is_refused_at_init() -> None:
    callback = _IsClosed()
    state = State(model=torch.nn.Linear(1, 1), callbacks=[callback])
    first = Engine(state, logger=None)
    first.run_event(Event.INIT)
    with pytest.raises(RuntimeError, match="Cannot create a new trainer with an open callback "
                                           "or logger from a previous trainer.*_IsClosed"):
        Engine(state, logger=None).run_event(Event.INIT)
    first.close()


def test_a_registered_pass_runs_where_no_algorithm_matched_and_each_instance_is_traced() -> None:
    """Composer's ``register_pass`` contract: a pass may add algorithms (so it runs even when
    none matched), and two algorithms of one class each get a trace, ``order`` their place."""
    calls: list[str] = []

    class Echo(Algorithm):
        def __init__(self, code: int) -> None:
            self.code = code

        def match(self, event: Event, state: State) -> bool:
            return event == Event.BATCH_START

        def apply(self, event: Event, state: State, logger: Any) -> int:
            calls.append(f"{self.code}:{event.value}")
            return self.code

    state = State(model=torch.nn.Linear(1, 1), algorithms=[])
    engine = Engine(state, logger=None)
    engine.register_pass(lambda algorithms, event: [*algorithms, Echo(7), Echo(8)])
    traces = engine.run_event(Event.BATCH_START)
    assert [(t.exit_code, t.order) for t in traces.values()] == [(7, 0), (8, 1)]
    assert calls == ["7:batch_start", "8:batch_start"]
    assert list(traces) == ["Echo/BATCH_START", "Echo#1/BATCH_START"]


def test_a_pass_index_pair_may_be_a_list_and_state_algorithms_is_composers_private_list() -> None:
    def by_name(algorithms: Any, event: Event) -> Any:
        return sorted(algorithms, key=lambda a: type(a).__name__)

    state = State(model=torch.nn.Linear(1, 1))
    assert Engine(state, None, algorithm_passes=[by_name, 0]).passes[0] is by_name
    assert Engine(state, None, algorithm_passes=[(by_name, 1)]).passes[1] is by_name
    with pytest.raises(ValueError, match="neither a pass"):
        Engine(state, None, algorithm_passes=[by_name, "first"])
    calls: list[str] = []
    state._algorithms = [Recorder("a", calls)]  # Composer's tests assign the private list
    assert state.algorithms is state._algorithms
    Engine(state, None).run_event(Event.BEFORE_FORWARD)
    assert calls == ["a:before_forward"]
    state.algorithms = Recorder("b", calls)  # one algorithm: a list of one
    assert [a._name for a in state.algorithms] == ["b"]
