"""State built as Composer's documentation builds it (``composer/core/state.py``), for the
tests of callbacks; and the ``sec`` unit end to end."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from cadence import Callback, State, Time, Timestamp, TimeUnit, Trainer
from cadence.core import Evaluator, Precision
from cadence.devices import DeviceCPU
from tests.common.models import SimpleModel, make_dataloader


def test_constructed_as_in_composer() -> None:
    model = torch.nn.Linear(2, 2)
    loader = DataLoader(list(range(12)), batch_size=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = State(model, 42, "my-run", DeviceCPU(), max_duration="3ep", dataloader=loader,
                  dataloader_label="train", optimizers=optimizer, precision=Precision.FP32,
                  evaluators=Evaluator(label="eval", dataloader=loader))
    assert state.model is model and state.rank_zero_seed == 42 and state.run_name == "my-run"
    assert state.device == torch.device("cpu")
    assert state.max_duration == Time(3, TimeUnit.EPOCH) and isinstance(state.max_duration, Time)
    assert state.dataloader is loader and state.dataloader_label == "train"
    assert state.dataloader_len == Time(3, TimeUnit.BATCH)
    assert state.optimizers == [optimizer] and state.precision == Precision.FP32
    assert [e.label for e in state.evaluators] == ["eval"]
    assert state.timestamp == Timestamp() and state.eval_timestamp == Timestamp()
    assert state.predict_timestamp == Timestamp() and state.previous_timestamp is None
    assert state.get_elapsed_duration() == Time(0.0, TimeUnit.DURATION)


def test_one_optimizer_scheduler_or_evaluator_may_be_assigned_alone() -> None:
    """Composer's setters: ``state.schedulers = StepLR(...)`` (its test_state does this)
    holds a list of one, which checkpoints save."""
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adadelta(model.parameters())
    state = State(model=model, optimizers=optimizer, max_duration="3ep")
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3)
    state.schedulers = scheduler
    assert state.schedulers == [scheduler]
    assert state.state_dict()["schedulers"] == [scheduler.state_dict()]
    other = torch.optim.SGD(model.parameters(), lr=0.1)
    state.optimizers = other
    assert state.optimizers == [other]
    state.evaluators = Evaluator(label="eval", dataloader=make_dataloader(1))
    assert [e.label for e in state.evaluators] == ["eval"]


def test_set_dataloader_and_dataloader_len() -> None:
    state = State(model=torch.nn.Linear(1, 1), max_duration="10ba")
    assert state.dataloader is None and state.dataloader_len is None
    loader = DataLoader(list(range(20)), batch_size=4)  # 5 batches
    state.set_dataloader(loader, "eval")
    assert state.dataloader_label == "eval" and state.dataloader_len == Time(5, "ba")
    state.set_dataloader(loader, "eval", dataloader_len=2)
    assert state.dataloader_len == 2
    state.set_dataloader(loader, "eval", dataloader_len=Time(50, "ba"))  # capped at len()
    assert state.dataloader_len == 5
    state.set_dataloader(iter(range(3)), "stream")  # unsized: unknown length
    assert state.dataloader_len is None
    with pytest.raises(ValueError, match="label"):
        state.set_dataloader(loader)
    state.set_dataloader(None)
    assert state.dataloader is None and state.dataloader_label is None


def test_max_duration_is_a_time_and_refuses_dur() -> None:
    state = State(model=torch.nn.Linear(1, 1))
    state.max_duration = "100ba"
    assert state.max_duration == Time(100, "ba")
    state.max_duration = Time(5, "ep")
    assert state.max_duration.unit == TimeUnit.EPOCH
    with pytest.raises(ValueError, match="dur"):
        state.max_duration = "0.5dur"


def test_stop_training_both_ways() -> None:
    state = State(model=torch.nn.Linear(1, 1))
    assert not state.stop_training
    state.stop_training()  # Composer's method
    assert state.stop_training
    state.stop_training = False  # cadence's flag
    assert not state.stop_training
    state.stop_training = True
    assert state.stop_training


def test_elapsed_duration_inside_an_epoch() -> None:
    state = State(model=torch.nn.Linear(1, 1), max_duration="2ep", dataloader_len=4)
    state.timestamp = Timestamp(epoch=1, batch=6, batch_in_epoch=2)
    assert state.get_elapsed_duration() == pytest.approx(0.75)
    assert state.get_elapsed_duration().unit == TimeUnit.DURATION


def test_eval_timestamp_and_dataloader_follow_evaluation() -> None:
    seen: list[tuple[Any, int, int]] = []

    class Watch(Callback):
        def eval_batch_end(self, state: State, logger: Any) -> None:
            seen.append((state.dataloader_label, int(state.eval_timestamp.batch),
                         int(state.eval_timestamp.sample)))

    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=2),
                      eval_dataloader=make_dataloader(num_batches=3, seed=1), max_duration="1ep",
                      callbacks=Watch(), progress_bar=False, device="cpu", seed=0)
    trainer.fit()
    trainer.close()
    assert seen == [("eval", 1, 4), ("eval", 2, 8), ("eval", 3, 12)]
    assert trainer.state.dataloader_label == "train"


def test_wall_clock_is_tracked_and_max_duration_in_seconds_stops_the_run() -> None:
    seen: list[float] = []  # the run's wall clock at each batch end, seconds

    class Slow(Callback):
        def batch_end(self, state: State, logger: Any) -> None:
            time.sleep(0.3)
            seen.append(state.timestamp.total_wct.total_seconds())

    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=10),
                      max_duration="1sec", callbacks=Slow(), progress_bar=False, device="cpu",
                      seed=0)
    start = time.perf_counter()
    trainer.fit()
    elapsed = time.perf_counter() - start
    timestamp = trainer.state.timestamp
    trainer.close()
    # each batch takes >= 0.3 s (its lap holds the previous batch's sleep): the run stops at
    # the first batch end whose wall clock reached 1 s (batch 5 on an idle machine, earlier
    # on a loaded one), not before and not after
    assert int(timestamp.batch) == len(seen) <= 5 and elapsed < 10
    assert all(wct < 1.0 for wct in seen[:-1])
    assert timestamp.total_wct.total_seconds() >= 1.0
    assert timestamp.batch_wct.total_seconds() >= 0.3
    assert timestamp.get("sec") >= 1
