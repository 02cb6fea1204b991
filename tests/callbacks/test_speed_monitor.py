from __future__ import annotations

import pytest
import torch

import cadence.callbacks.speed_monitor as speed_monitor_module
from cadence.callbacks import SpeedMonitor
from cadence.trainer import registry
from cadence.trainer.core import State, Time
from cadence.trainer.loggers import InMemoryLogger, Logger
from tests.common.clock import FakeClock, install_fake_clock


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    return install_fake_clock(monkeypatch, speed_monitor_module, start=100.0)


def make() -> tuple[State, InMemoryLogger, Logger]:
    model = torch.nn.Linear(2, 2)
    state = State(model=model, optimizers=[torch.optim.SGD(model.parameters(), lr=0.1)],
                  max_duration=Time(2, "ep"), dataloader_len=100)
    memory = InMemoryLogger()
    return state, memory, Logger(state, [memory])


def train(state: State, monitor: SpeedMonitor, logger: Logger, clock: FakeClock,
          seconds: list[float], samples: int = 8, tokens: int = 512) -> None:
    for duration in seconds:
        monitor.batch_start(state, logger)
        clock.now += duration
        state.timestamp = state.timestamp.to_next_batch(samples=samples, tokens=tokens)
        monitor.batch_end(state, logger)


def test_throughput_is_samples_over_elapsed(clock: FakeClock) -> None:
    state, memory, logger = make()
    monitor = SpeedMonitor(window_size=3)
    monitor.fit_start(state, logger)
    train(state, monitor, logger, clock, [5.0])  # first batch: warm-up, no throughput yet
    assert "throughput/samples_per_sec" not in memory.most_recent_values
    assert memory.most_recent_values["wall_clock/train"] == pytest.approx(5.0)
    train(state, monitor, logger, clock, [0.5])
    values = memory.most_recent_values
    assert values["throughput/samples_per_sec"] == pytest.approx(8 / 0.5)
    assert values["throughput/batches_per_sec"] == pytest.approx(1 / 0.5)
    assert values["throughput/tokens_per_sec"] == pytest.approx(512 / 0.5)
    assert "throughput/device/samples_per_sec" not in values  # world size 1: same as above
    # Window of 3 batches: the last three took 1 + 2 + 2 seconds.
    train(state, monitor, logger, clock, [0.5, 1.0, 2.0, 2.0])
    values = memory.most_recent_values
    assert values["throughput/samples_per_sec"] == pytest.approx(3 * 8 / 5.0)
    assert values["throughput/batches_per_sec"] == pytest.approx(3 / 5.0)
    assert values["wall_clock/train"] == pytest.approx(11.0)
    steps, _ = memory.get_timeseries("throughput/samples_per_sec")
    assert steps == [2, 3, 4, 5, 6]


def test_eval_time_is_excluded(clock: FakeClock) -> None:
    state, memory, logger = make()
    monitor = SpeedMonitor(window_size=10)
    monitor.fit_start(state, logger)
    train(state, monitor, logger, clock, [1.0, 1.0])
    for event in ("eval_before_all", "eval_start"):
        getattr(monitor, event)(state, logger)
    clock.now += 30.0
    monitor.eval_end(state, logger)
    clock.now += 5.0  # between evaluators: still eval
    monitor.eval_start(state, logger)
    clock.now += 5.0
    monitor.eval_end(state, logger)
    monitor.eval_after_all(state, logger)
    train(state, monitor, logger, clock, [1.0])
    values = memory.most_recent_values
    assert values["throughput/samples_per_sec"] == pytest.approx(2 * 8 / 2.0)
    assert values["wall_clock/train"] == pytest.approx(3.0)
    assert values["wall_clock/eval"] == pytest.approx(40.0)
    assert values["wall_clock/total"] == pytest.approx(43.0)


def test_eval_start_end_alone(clock: FakeClock) -> None:
    state, memory, logger = make()
    monitor = SpeedMonitor()
    monitor.fit_start(state, logger)
    train(state, monitor, logger, clock, [1.0])
    monitor.eval_start(state, logger)
    clock.now += 7.0
    monitor.eval_end(state, logger)
    train(state, monitor, logger, clock, [1.0])
    assert memory.most_recent_values["wall_clock/train"] == pytest.approx(2.0)
    assert memory.most_recent_values["wall_clock/eval"] == pytest.approx(7.0)


def test_per_device_and_no_tokens(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    state, memory, logger = make()
    monitor = SpeedMonitor()
    monitor.fit_start(state, logger)
    train(state, monitor, logger, clock, [1.0, 2.0], samples=32, tokens=0)
    values = memory.most_recent_values
    assert values["throughput/samples_per_sec"] == pytest.approx(16.0)
    assert values["throughput/device/samples_per_sec"] == pytest.approx(4.0)
    assert "throughput/tokens_per_sec" not in values


def test_wall_clock_resumes_from_state_dict(clock: FakeClock) -> None:
    state, memory, logger = make()
    monitor = SpeedMonitor()
    monitor.fit_start(state, logger)
    train(state, monitor, logger, clock, [3.0, 4.0])
    saved = monitor.state_dict()
    assert saved["train_seconds"] == pytest.approx(7.0)

    resumed = SpeedMonitor()
    resumed.load_state_dict(saved)
    clock.now += 60.0  # restart time is not training time
    resumed.fit_start(state, logger)
    train(state, resumed, logger, clock, [2.0])
    assert memory.most_recent_values["wall_clock/train"] == pytest.approx(9.0)
    resumed.fit_end(state, logger)
    resumed.close()
    resumed.close()


def test_no_fit_start_still_measures(clock: FakeClock) -> None:
    state, memory, logger = make()
    monitor = SpeedMonitor()
    train(state, monitor, logger, clock, [1.0, 1.0, 1.0])
    assert memory.most_recent_values["throughput/batches_per_sec"] == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_rejects_bad_window(bad: float) -> None:
    with pytest.raises(ValueError, match="window_size"):
        SpeedMonitor(window_size=bad)  # type: ignore[arg-type]


def test_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_builtins_loaded", True)
    assert registry.callbacks.get("speed_monitor") is SpeedMonitor
