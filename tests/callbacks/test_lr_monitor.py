from __future__ import annotations

import pytest
import torch

from cadence.callbacks import LRMonitor
from cadence.registry import registry
from cadence.core import State, Time
from cadence.loggers import InMemoryLogger, Logger


def test_logs_each_param_group() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    optimizer = torch.optim.AdamW([
        {"params": model[0].parameters(), "lr": 1e-3},
        {"params": model[1].parameters(), "lr": 5e-4},
    ])
    state = State(model=model, optimizers=[optimizer], max_duration=Time(2, "ep"))
    memory = InMemoryLogger()
    logger = Logger(state, [memory])
    monitor = LRMonitor()
    state.timestamp = state.timestamp.to_next_batch(samples=8)
    monitor.batch_end(state, logger)
    optimizer.param_groups[0]["lr"] = 2e-3
    state.timestamp = state.timestamp.to_next_batch(samples=8)
    monitor.batch_end(state, logger)
    assert memory.steps_and_values("lr-AdamW/group0") == ([1, 2], [1e-3, 2e-3])
    assert memory.steps_and_values("lr-AdamW/group1") == ([1, 2], [5e-4, 5e-4])
    monitor.close()
    monitor.close()


def test_same_class_optimizers_get_distinct_keys() -> None:
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    state = State(model=a, optimizers=[torch.optim.SGD(a.parameters(), lr=0.1),
                                       torch.optim.SGD(b.parameters(), lr=0.2)])
    memory = InMemoryLogger()
    LRMonitor().batch_end(state, Logger(state, [memory]))
    assert memory.most_recent_values == {"lr-SGD_0/group0": 0.1, "lr-SGD_1/group0": 0.2}


def test_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_builtins_loaded", True)
    assert registry.callbacks.get("lr_monitor") is LRMonitor
