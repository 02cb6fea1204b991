from __future__ import annotations

from typing import Optional

import pytest
import torch

import cadence.callbacks.runtime_estimator as runtime_estimator_module
from cadence import State, Time, Trainer
from cadence.callbacks import RuntimeEstimator
from cadence.loggers import InMemoryLogger, Logger
from tests.common.clock import FakeClock, install_fake_clock
from tests.common.models import SimpleModel, make_dataloader

KEY = "time/remaining_estimate"  # Composer's name


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    return install_fake_clock(monkeypatch, runtime_estimator_module, start=1000.0)


def make(max_duration: Optional[Time] = Time(10, "ba")) -> tuple[State, InMemoryLogger, Logger]:
    state = State(model=torch.nn.Linear(1, 1), max_duration=max_duration, dataloader_len=5)
    memory = InMemoryLogger()
    return state, memory, Logger(state, [memory])


def batch(state: State, estimator: RuntimeEstimator, logger: Logger, clock: FakeClock,
          seconds: float) -> None:
    estimator.batch_start(state, logger)
    clock.now += seconds
    state.timestamp = state.timestamp.to_next_batch(samples=4)
    estimator.batch_end(state, logger)


def test_extrapolates_the_rate_after_the_skipped_batches(clock: FakeClock) -> None:
    state, memory, logger = make()
    estimator = RuntimeEstimator()  # skip_batches=1
    estimator.fit_start(state, logger)
    batch(state, estimator, logger, clock, 30.0)  # warm-up: not counted, nothing logged
    assert KEY not in memory.data
    batch(state, estimator, logger, clock, 2.0)
    # 2 s for 0.1 of the run; 0.8 left -> 16 s.
    assert memory.most_recent_values[KEY] == pytest.approx(16.0)
    batch(state, estimator, logger, clock, 4.0)
    # 6 s for 0.2; 0.7 left -> 21 s.
    assert memory.most_recent_values[KEY] == pytest.approx(21.0)


def test_composers_keys_in_a_run() -> None:
    """Composer's names: ``time/remaining_estimate`` per batch, and its unit as the
    hyperparameter ``time/remaining_estimate_unit`` (logged at ``INIT``)."""
    memory = InMemoryLogger()
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=3),
                      max_duration="3ba", progress_bar=False, loggers=[memory],
                      callbacks=[RuntimeEstimator(time_unit="minutes")])
    trainer.fit()
    trainer.close()
    assert memory.hyperparameters["time/remaining_estimate_unit"] == "minutes"
    steps, values = memory.steps_and_values(KEY)
    assert steps == [2, 3] and all(v >= 0 for v in values)


def test_leaves_eval_time_out(clock: FakeClock) -> None:
    state, memory, logger = make()
    estimator = RuntimeEstimator(skip_batches=1, time_unit="minutes")
    estimator.fit_start(state, logger)
    batch(state, estimator, logger, clock, 1.0)
    batch(state, estimator, logger, clock, 60.0)
    estimator.eval_before_all(state, logger)
    estimator.eval_start(state, logger)
    clock.now += 500.0  # a long evaluation
    estimator.eval_end(state, logger)
    estimator.eval_after_all(state, logger)
    batch(state, estimator, logger, clock, 60.0)
    # 120 s of training for 0.2 of the run; 0.7 left -> 420 s = 7 minutes.
    assert memory.most_recent_values[KEY] == pytest.approx(7.0)


def test_zero_skip_counts_from_fit_start_and_ends_at_zero(clock: FakeClock) -> None:
    state, memory, logger = make(Time(2, "ba"))
    estimator = RuntimeEstimator(skip_batches=0)
    estimator.fit_start(state, logger)
    batch(state, estimator, logger, clock, 3.0)
    assert memory.most_recent_values[KEY] == pytest.approx(3.0)
    batch(state, estimator, logger, clock, 3.0)
    assert memory.most_recent_values[KEY] == 0.0


def test_nothing_without_max_duration(clock: FakeClock) -> None:
    state, memory, logger = make(max_duration=None)
    estimator = RuntimeEstimator()
    estimator.fit_start(state, logger)
    for _ in range(3):
        batch(state, estimator, logger, clock, 1.0)
    assert KEY not in memory.data


@pytest.mark.parametrize("kwargs", [{"skip_batches": -1}, {"skip_batches": 1.5},
                                    {"time_unit": "fortnights"}])
def test_rejects_bad_arguments(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="RuntimeEstimator"):
        RuntimeEstimator(**kwargs)  # type: ignore[arg-type]


def test_logs_in_a_real_run() -> None:
    memory = InMemoryLogger()
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=4),
                      eval_dataloader=make_dataloader(num_batches=1, seed=1),
                      eval_interval="2ba", max_duration="4ba", seed=0, progress_bar=False,
                      callbacks=[RuntimeEstimator()], loggers=[memory])
    trainer.fit()
    steps, values = memory.steps_and_values(KEY)
    assert steps == [2, 3, 4]
    assert all(v >= 0.0 for v in values) and values[-1] == 0.0
