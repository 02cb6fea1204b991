from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from cadence import Trainer

from cadence.registry import registry
from cadence.core import State, Timestamp
from cadence.loggers import (
    ConsoleLogger,
    FileLogger,
    InMemoryLogger,
    Logger,
    LoggerDestination,
    ProgressBarLogger,
)


def test_stores_timestamp_value_tuples_as_composer() -> None:
    state = State(model=torch.nn.Linear(2, 2))
    memory = InMemoryLogger()
    logger = Logger(state, [memory])
    memory.init(state, logger)  # the Trainer fires INIT; Composer's logger needs it too
    logger.log_metrics({"loss/train/total": torch.tensor(2.5)})  # step = timestamp.batch = 0
    first = state.timestamp
    state.timestamp = state.timestamp.to_next_batch(samples=8)
    logger.log_metrics({"loss/train/total": torch.tensor(1.5), "lr-SGD/group0": 0.1})
    logger.log_hyperparameters({"seed": 1})
    logger.log_hyperparameters({"lr": 0.1})
    data = memory.data["loss/train/total"]
    assert [value for _, value in data] == [2.5, 1.5]
    assert type(data[0][1]) is float
    assert isinstance(data[0][0], Timestamp) and data[0][0] is first
    assert [int(ts.batch) for ts, _ in data] == [0, 1]
    assert [int(ts.sample) for ts, _ in data] == [0, 8]
    assert memory.most_recent_values == {"loss/train/total": 1.5, "lr-SGD/group0": 0.1}
    assert memory.most_recent_timestamps["lr-SGD/group0"] is state.timestamp
    assert memory.most_recent_steps == {"loss/train/total": 1, "lr-SGD/group0": 1}
    assert memory.hyperparameters == {"seed": 1, "lr": 0.1}
    assert memory.steps_and_values("loss/train/total") == ([0, 1], [2.5, 1.5])
    memory.close()
    memory.close()


def test_get_timeseries_returns_composers_dict_of_arrays() -> None:
    state = State(model=torch.nn.Linear(2, 2))
    memory = InMemoryLogger()
    logger = Logger(state, [memory])
    memory.init(state, logger)
    for batch in range(3):
        logger.log_metrics({"accuracy/val": batch * 3})
        state.timestamp = state.timestamp.to_next_batch(samples=4, tokens=10)
    series = memory.get_timeseries("accuracy/val")
    assert isinstance(series["accuracy/val"], np.ndarray)
    assert series["accuracy/val"].tolist() == [0, 3, 6]
    assert series["batch"].tolist() == [0, 1, 2]
    assert series["sample"].tolist() == [0, 4, 8]
    assert series["token"].tolist() == [0, 10, 20]
    assert series["epoch"].tolist() == [0, 0, 0]
    assert {len(v) for v in series.values()} == {3}
    # Composer raises ValueError for a metric never logged; a KeyError too, as before
    with pytest.raises(ValueError, match="never logged"):
        memory.get_timeseries("nope")
    with pytest.raises(KeyError, match="never logged"):
        memory.steps_and_values("nope")


def test_without_init_values_have_no_timestamp() -> None:
    memory = InMemoryLogger()
    memory.log_metrics({"a": 1.0}, step=5)
    assert memory.data["a"] == [(None, 1.0)]
    assert memory.steps_and_values("a") == ([5], [1.0])
    with pytest.raises(ValueError, match="before the InMemoryLogger got a State"):
        memory.get_timeseries("a")


def test_log_table_stores_split_json_and_checks_rows() -> None:
    state = State(model=torch.nn.Linear(2, 2))
    memory = InMemoryLogger()
    logger = Logger(state, [memory])
    logger.log_table(["prompt", "score"], [["hi", torch.tensor(0.5)], ["yo", 2]], name="samples")
    assert json.loads(memory.tables["samples"]) == {
        "columns": ["prompt", "score"], "data": [["hi", 0.5], ["yo", 2]]}
    logger.log_table(["a"], [[1]])  # Composer's default name
    assert "Table" in memory.tables
    with pytest.raises(ValueError, match="row 0 has 2 values for 1 columns"):
        memory.log_table(["a"], [[1, 2]])


def test_in_a_trainer_timestamps_follow_the_run() -> None:
    from tests.common.models import SimpleModel, make_dataloader

    memory = InMemoryLogger()
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=3),
                      max_duration="3ba", log_interval=1, loggers=[memory], progress_bar=False,
                      seed=0)
    trainer.fit()
    trainer.close()
    series = memory.get_timeseries("loss/train/total")
    assert series["batch"].tolist() == [1, 2, 3]
    assert series["loss/train/total"].shape == (3,)


def test_logger_upload_file_formats_names_and_reaches_destinations(tmp_path) -> None:
    class Store(LoggerDestination):
        def __init__(self) -> None:
            self.files: list[tuple[str, str, bool]] = []

        def can_upload_files(self) -> bool:
            return True

        def upload_file(self, state, remote_file_name, file_path, *, overwrite):
            self.files.append((remote_file_name, str(file_path), overwrite))

    state = State(model=torch.nn.Linear(2, 2), run_name="r1")
    store, memory = Store(), InMemoryLogger()
    logger = Logger(state, [memory, store])
    assert logger.has_file_upload_destination()
    assert not Logger(state, [memory]).has_file_upload_destination()
    logger.upload_file("{run_name}/logs-rank{rank}.txt", tmp_path / "{run_name}.txt")
    assert store.files == [("r1/logs-rank0.txt", str(tmp_path / "r1.txt"), False)]
    with pytest.raises(ValueError, match="unknown placeholder"):
        logger.upload_file("{nope}", tmp_path / "x")


def test_registered_names(monkeypatch: pytest.MonkeyPatch) -> None:
    # Look up only what importing cadence.loggers registered.
    monkeypatch.setattr(registry, "_builtins_loaded", True)
    assert registry.loggers.get("progress_bar") is ProgressBarLogger
    assert registry.loggers.get("console") is ConsoleLogger
    assert registry.loggers.get("file") is FileLogger
    assert registry.loggers.get("in_memory") is InMemoryLogger
    for name in ("progress_bar", "console", "file", "in_memory"):
        assert issubclass(registry.loggers.get(name), LoggerDestination)
