from __future__ import annotations

import pytest
import torch

from cadence.trainer import registry
from cadence.trainer.core import State
from cadence.trainer.loggers import (
    ConsoleLogger,
    FileLogger,
    InMemoryLogger,
    Logger,
    LoggerDestination,
    ProgressBarLogger,
)


def test_stores_python_values_by_step() -> None:
    state = State(model=torch.nn.Linear(2, 2))
    memory = InMemoryLogger()
    logger = Logger(state, [memory])
    logger.log_metrics({"loss/train/total": torch.tensor(2.5)})  # step = timestamp.batch = 0
    state.timestamp = state.timestamp.to_next_batch(samples=8)
    logger.log_metrics({"loss/train/total": torch.tensor(1.5), "lr-SGD/group0": 0.1})
    logger.log_hyperparameters({"seed": 1})
    logger.log_hyperparameters({"lr": 0.1})
    assert memory.data["loss/train/total"] == [(0, 2.5), (1, 1.5)]
    assert type(memory.data["loss/train/total"][0][1]) is float
    assert memory.most_recent_values == {"loss/train/total": 1.5, "lr-SGD/group0": 0.1}
    assert memory.most_recent_steps == {"loss/train/total": 1, "lr-SGD/group0": 1}
    assert memory.hyperparameters == {"seed": 1, "lr": 0.1}
    assert memory.get_timeseries("loss/train/total") == ([0, 1], [2.5, 1.5])
    with pytest.raises(KeyError, match="never logged"):
        memory.get_timeseries("nope")
    memory.close()
    memory.close()


def test_registered_names(monkeypatch: pytest.MonkeyPatch) -> None:
    # Look up only what importing cadence.trainer.loggers registered.
    monkeypatch.setattr(registry, "_builtins_loaded", True)
    assert registry.loggers.get("progress_bar") is ProgressBarLogger
    assert registry.loggers.get("console") is ConsoleLogger
    assert registry.loggers.get("file") is FileLogger
    assert registry.loggers.get("in_memory") is InMemoryLogger
    for name in ("progress_bar", "console", "file", "in_memory"):
        assert issubclass(registry.loggers.get(name), LoggerDestination)
