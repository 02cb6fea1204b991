"""TensorboardLogger: real event files, read back with tensorboard's EventAccumulator."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from cadence import State, Trainer
from cadence.registry import registry
from cadence.loggers import (
    InMemoryLogger, Logger, TensorboardLogger, TensorBoardLogger,
)
from cadence.loggers.tracker_destination import flatten_hyperparameters
from tests.common.models import SimpleModel, make_dataloader

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)


def read_events(folder: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def test_event_file_holds_the_loss_at_each_logged_step(tmp_path: Path) -> None:
    memory = InMemoryLogger()
    tensorboard = TensorboardLogger()
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=3),
                      eval_dataloader=make_dataloader(num_batches=1, seed=1),
                      max_duration="2ep", log_interval="2ba", seed=0, progress_bar=False,
                      run_name="tb", save_folder=str(tmp_path / "{run_name}"), save_interval=None,
                      loggers=[tensorboard, memory],
                      hyperparameters={"optimizer": {"name": "adamw", "lr": 1e-3},
                                       "betas": [0.9, 0.95]})
    trainer.fit()
    trainer.close()
    trainer.close()  # idempotent
    assert tensorboard.writer is None
    events = read_events(tmp_path / "tb" / "tensorboard")  # default: <save_folder>/tensorboard
    steps, losses = memory.steps_and_values("loss/train/total")
    assert steps == [1, 2, 4, 6]
    scalars = events.Scalars("loss/train/total")
    assert [e.step for e in scalars] == steps
    assert [e.value for e in scalars] == pytest.approx(losses, rel=1e-6)
    accuracy = events.Scalars("metrics/eval/MulticlassAccuracy")
    assert accuracy[-1].value == pytest.approx(
        memory.most_recent_values["metrics/eval/MulticlassAccuracy"])
    # Hyperparameters: the HPARAMS plugin's data and a JSON text summary.
    assert "hparams" in events.PluginAssets("hparams") or events.summary_metadata
    (text,) = [e for e in events.Tensors("hyperparameters/text_summary")]
    written = json.loads(text.tensor_proto.string_val[0].decode().strip("`\n"))
    assert written["optimizer.lr"] == 1e-3 and written["optimizer.name"] == "adamw"
    assert written["betas"] == "[0.9, 0.95]" and written["rank_zero_seed"] == 0


def test_log_dir_with_run_name_and_metrics_before_init(tmp_path: Path) -> None:
    state = State(model=torch.nn.Linear(1, 1), run_name="early")
    tensorboard = TensorBoardLogger(log_dir=str(tmp_path / "tb" / "{run_name}"))
    logger = Logger(state, [tensorboard])
    logger.log_metrics({"x": torch.tensor(1.5), "text": "skipped"}, step=0)
    assert tensorboard.writer is None  # nothing is written before INIT
    tensorboard.init(state, logger)
    logger.log_metrics({"x": 2.5}, step=3)
    tensorboard.close()
    events = read_events(tmp_path / "tb" / "early")
    assert [(e.step, e.value) for e in events.Scalars("x")] == [(0, 1.5), (3, 2.5)]
    assert events.Tags()["scalars"] == ["x"]
    logger.log_metrics({"x": 9.0}, step=4)  # after close: dropped, no error


def test_rank_zero_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    state = State(model=torch.nn.Linear(1, 1), run_name="r", save_folder=str(tmp_path / "q"))
    quiet = TensorboardLogger()
    quiet.init(state, Logger(state, [quiet]))
    quiet.log_metrics({"x": 1.0}, step=1)
    quiet.close()
    assert not (tmp_path / "q").exists()
    every = TensorboardLogger(rank_zero_only=False)
    every.init(state, Logger(state, [every]))
    every.log_metrics({"x": 1.0}, step=1)
    every.close()
    assert read_events(tmp_path / "q" / "tensorboard" / "rank1").Scalars("x")[0].value == 1.0


def test_flatten_hyperparameters() -> None:
    assert flatten_hyperparameters({"a": {"b": {"c": 1}}, "d": None, "e": torch.tensor(2.0),
                                    "f": (1, 2)}) == {"a.b.c": 1, "d": "None", "e": 2.0,
                                                      "f": "[1, 2]"}


def test_missing_tensorboard_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(ImportError, match="pip install tensorboard"):
        TensorboardLogger()


def test_rejects_bad_flush_interval() -> None:
    with pytest.raises(ValueError, match="flush_interval"):
        TensorboardLogger(flush_interval=0)


def test_nameable_from_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    assert registry.loggers.get("tensorboard") is TensorboardLogger
