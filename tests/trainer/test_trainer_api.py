"""The Trainer's Composer API: constructor keywords, fit(...) arguments, eval(...),
eval_interval as a callable, Evaluator(eval_interval=, subset_num_batches=),
create_interval_scheduler, save_checkpoint, the run name from the environment."""

from __future__ import annotations

import inspect
import io
from pathlib import Path
from typing import Any

import pytest
import torch

from cadence import Callback, Evaluator, Event, State, Trainer
from cadence.loggers import InMemoryLogger
from cadence.utils import create_interval_scheduler
from tests.common.events import EventCounter
from tests.common.models import SimpleModel, make_dataloader


def _trainer(**kwargs: Any) -> Trainer:
    kwargs.setdefault("model", SimpleModel())
    kwargs.setdefault("train_dataloader", make_dataloader(num_batches=3))
    kwargs.setdefault("progress_bar", False)
    kwargs.setdefault("seed", 0)
    return Trainer(**kwargs)


def test_constructor_takes_composers_keywords_with_composers_defaults() -> None:
    params = inspect.signature(Trainer).parameters
    expected = {"train_dataloader_label": "train", "train_subset_num_batches": -1,
                "scale_schedule_ratio": 1.0, "step_schedulers_every_batch": None,
                "log_to_console": False, "auto_log_hparams": False, "profiler": None,
                "eval_subset_num_batches": -1, "dist_timeout": 600.0}
    for name, default in expected.items():
        assert params[name].default == default, name
    for name in ("console_stream", "console_log_interval", "device", "algorithm_passes"):
        assert name in params


def test_fit_signature_is_composers() -> None:
    params = inspect.signature(Trainer.fit).parameters
    names = ["train_dataloader", "train_dataloader_label", "train_subset_num_batches",
             "spin_dataloaders", "duration", "reset_time", "schedulers", "scale_schedule_ratio",
             "step_schedulers_every_batch", "eval_dataloader", "eval_subset_num_batches",
             "eval_interval", "device_train_microbatch_size", "precision"]
    assert list(params)[1:] == names
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in names)
    assert params["eval_interval"].default == 1 and params["reset_time"].default is False
    eval_params = inspect.signature(Trainer.eval).parameters
    assert list(eval_params)[1:] == ["eval_dataloader", "subset_num_batches"]
    assert eval_params["subset_num_batches"].default == -1


def test_fit_duration_adds_to_the_timestamp_and_reset_time_restarts() -> None:
    trainer = _trainer()
    trainer.fit(duration="2ba")
    assert int(trainer.state.timestamp.batch) == 2
    trainer.fit(duration="2ba")  # two more, continuing the epoch
    assert int(trainer.state.timestamp.batch) == 4
    assert trainer.state.max_duration == "4ba"
    trainer.fit(duration=1, reset_time=True)  # an int is epochs, counted from 0 again
    assert int(trainer.state.timestamp.batch) == 3 and int(trainer.state.timestamp.epoch) == 1
    with pytest.raises(ValueError, match="'dur'"):
        trainer.fit(duration="0.5dur")
    trainer.close()
    with pytest.raises(ValueError, match="duration"):
        _trainer().fit()


def test_fit_train_dataloader_and_subset() -> None:
    trainer = _trainer(max_duration="2ep", train_subset_num_batches=2)
    trainer.fit()
    assert int(trainer.state.timestamp.batch) == 4  # 2 batches in each of 2 epochs
    trainer.fit(train_dataloader=make_dataloader(num_batches=5), train_subset_num_batches=3,
                duration="1ep")
    assert int(trainer.state.timestamp.batch) == 7
    assert trainer.state.dataloader_label == "train"
    trainer.close()
    with pytest.raises(ValueError, match="train_subset_num_batches"):
        _trainer(train_subset_num_batches=0)


def test_scale_schedule_ratio_scales_max_duration() -> None:
    trainer = _trainer(max_duration="6ba", scale_schedule_ratio=0.5)
    assert trainer.state.max_duration == "3ba"
    trainer.fit()
    assert int(trainer.state.timestamp.batch) == 3
    trainer.close()


@pytest.mark.parametrize("every_batch, steps", [(None, 2), (False, 2), (True, 6)])
def test_torch_schedulers_step_per_epoch_unless_asked(every_batch: Any, steps: int) -> None:
    model = SimpleModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    trainer = _trainer(model=model, optimizers=optimizer, schedulers=scheduler,
                       max_duration="2ep", step_schedulers_every_batch=every_batch)
    trainer.fit()
    trainer.close()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5 ** steps)


class Calls(Callback):
    def __init__(self) -> None:
        self.eval_batches: list[int] = []

    def eval_start(self, state: State, logger: Any) -> None:
        self.eval_batches.append(int(state.timestamp.batch))


def test_eval_interval_callable_is_asked_at_batch_end_and_epoch_end() -> None:
    seen: list[tuple[int, Event]] = []

    def every_second_batch(state: State, event: Event) -> bool:
        seen.append((int(state.timestamp.batch), event))
        return event == Event.BATCH_END and int(state.timestamp.batch) % 2 == 0

    calls = Calls()
    trainer = _trainer(max_duration="2ep", eval_dataloader=make_dataloader(num_batches=1),
                       eval_interval=every_second_batch, callbacks=[calls])
    trainer.fit()
    trainer.close()
    assert calls.eval_batches == [2, 4, 6]  # only what the callable says
    assert {event for _, event in seen} == {Event.BATCH_END, Event.EPOCH_END}
    assert seen[:3] == [(1, Event.BATCH_END), (2, Event.BATCH_END), (3, Event.BATCH_END)]


def test_create_interval_scheduler_as_eval_interval() -> None:
    calls = Calls()
    interval = create_interval_scheduler("2ba", checkpoint_events=False,
                                         final_events={Event.BATCH_END})
    trainer = _trainer(max_duration="5ba", eval_dataloader=make_dataloader(num_batches=1),
                       eval_interval=interval, callbacks=[calls])
    trainer.fit()
    trainer.close()
    assert calls.eval_batches == [2, 4, 5]  # every 2 batches, and the end of training


def test_evaluators_have_their_own_interval_and_subset() -> None:
    counter = EventCounter()
    memory = InMemoryLogger()
    often = Evaluator(label="often", dataloader=make_dataloader(num_batches=3),
                      eval_interval="1ba", subset_num_batches=1)
    rare = Evaluator(label="rare", dataloader=make_dataloader(num_batches=3))
    trainer = _trainer(max_duration="1ep", eval_dataloader=[often, rare], eval_interval="1ep",
                       callbacks=[counter], loggers=[memory])
    trainer.fit()
    trainer.close()
    assert len(memory.data["metrics/often/MulticlassAccuracy"]) == 3
    assert len(memory.data["metrics/rare/MulticlassAccuracy"]) == 1
    assert counter.counts[Event.EVAL_BATCH_START] == 3 * 1 + 1 * 3


def test_standalone_eval_fires_its_events_and_keeps_the_trainers_evaluators() -> None:
    counter = EventCounter()
    own = make_dataloader(num_batches=2)
    trainer = _trainer(max_duration="1ba", eval_dataloader=own, callbacks=[counter])
    before = len(counter.events)
    results = trainer.eval(eval_dataloader=Evaluator(label="other",
                                                     dataloader=make_dataloader(num_batches=3)),
                           subset_num_batches=1)
    assert set(results) == {"metrics/other/MulticlassAccuracy"}
    events = counter.events[before:]
    assert events[0] == Event.EVAL_STANDALONE_START and events[-1] == Event.EVAL_STANDALONE_END
    assert events.count(Event.EVAL_BATCH_START) == 1
    assert [e.label for e in trainer.state.evaluators] == ["eval"]
    assert set(trainer.eval()) == {"metrics/eval/MulticlassAccuracy"}
    trainer.close()


def test_save_checkpoint_names_and_weights_only(tmp_path: Path) -> None:
    trainer = _trainer(max_duration="2ba", save_folder=str(tmp_path / "run"), save_interval=None)
    trainer.fit()
    path = trainer.save_checkpoint("mine-ep{epoch}-ba{batch}-rank{rank}")
    assert path == str(tmp_path / "run" / "mine-ep0-ba2-rank0.pt") and Path(path).is_file()
    light = trainer.save_checkpoint("weights", weights_only=True)
    assert light is not None and Path(light).stat().st_size < Path(path).stat().st_size
    trainer.close()
    restored = _trainer(max_duration="2ba", load_path=path)
    for mine, theirs in zip(restored.state.model.parameters(),
                            trainer.state.model.parameters()):
        assert torch.equal(mine, theirs)
    assert int(restored.state.timestamp.batch) == 2
    restored.close()


def test_run_name_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPOSER_RUN_NAME", "from-composer")
    assert _trainer().state.run_name == "from-composer"
    monkeypatch.setenv("CADENCE_RUN_NAME", "from-cadence")
    assert _trainer().state.run_name == "from-cadence"
    assert _trainer(run_name="given").state.run_name == "given"


def test_auto_log_hparams_and_console_and_profiler() -> None:
    memory = InMemoryLogger()
    stream = io.StringIO()
    profiler = EventCounter()
    trainer = _trainer(max_duration="2ba", loggers=[memory], auto_log_hparams=True,
                       log_to_console=True, console_stream=stream, console_log_interval="1ba",
                       profiler=profiler, hyperparameters={"lr": 0.5})
    trainer.fit()
    trainer.close()
    hparams = memory.hyperparameters
    assert hparams["max_duration"] == "2ba" and hparams["model"] == "SimpleModel"
    assert hparams["lr"] == 0.5 and hparams["log_to_console"] is True
    lines = stream.getvalue().splitlines()
    assert sum("loss/train/total" in line for line in lines) == 2  # every batch
    assert profiler.counts[Event.BATCH_END] == 2
    with pytest.raises(TypeError, match="profiler"):
        _trainer(profiler=object())
    with pytest.raises(ValueError, match="console_stream"):
        _trainer(log_to_console=True, console_stream="stdin")


def test_create_interval_scheduler_as_save_interval(tmp_path: Path) -> None:
    from cadence.callbacks.checkpoint_saver import CheckpointSaver

    interval = create_interval_scheduler("2ba")  # checkpoint events, end of training included
    trainer = _trainer(max_duration="5ba", save_folder=str(tmp_path), save_interval=interval,
                       save_num_checkpoints_to_keep=-1)
    trainer.fit()
    trainer.close()
    saver = next(c for c in trainer.state.callbacks if isinstance(c, CheckpointSaver))
    assert saver.save_interval is interval
    assert [Path(p).name for p in saver.saved_checkpoints] == [
        "ep0-ba2-rank0.pt", "ep1-ba4-rank0.pt", "ep1-ba5-rank0.pt"]
    never = create_interval_scheduler(0, include_end_of_training=False)
    assert never(trainer.state, Event.EPOCH_CHECKPOINT) is False
    with pytest.raises(ValueError):
        create_interval_scheduler("1xyz")


def test_profiler_argument_takes_the_profiler_callback(tmp_path: Path) -> None:
    from cadence.callbacks.profiler import ProfilerCallback

    profiler = ProfilerCallback(warmup=1, active=1, folder=str(tmp_path))
    trainer = _trainer(max_duration="2ba", profiler=profiler)
    assert profiler in trainer.state.callbacks
    trainer.fit()
    trainer.close()
    assert list(tmp_path.rglob("*.json"))  # the profiler ran and wrote its trace


@pytest.mark.parametrize("max_duration,num_batches,expected", [
    ("13sp", 13, [2, 4, 6, 8, 10, 12, 13]),  # ceil(1.3) = 2 samples (round would say 1)
    ("4ep", 3, [5, 10, 12]),  # epochs count batches: ceil(0.35 * 4 * 3) = 5, then the end
])
def test_a_dur_eval_interval_is_rounded_up_in_max_durations_unit(
        max_duration: str, num_batches: int, expected: list[int]) -> None:
    """Composer's rule (``create_interval_scheduler``): ``'0.1dur'`` of ``13sp`` evaluates
    every ``ceil(1.3) = 2`` samples; of epochs, every ``ceil(fraction * batches)`` batches."""
    calls = Calls()
    interval = "0.1dur" if max_duration.endswith("sp") else "0.35dur"
    trainer = _trainer(max_duration=max_duration,
                       train_dataloader=make_dataloader(num_batches=num_batches,
                                                        batch_size=1 if num_batches == 13 else 4),
                       eval_dataloader=make_dataloader(num_batches=1),
                       eval_interval=interval, callbacks=[calls])
    trainer.fit()
    trainer.close()
    assert calls.eval_batches == expected
