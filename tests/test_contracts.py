"""Contract tests over every registered algorithm, callback and logger destination:
each constructs with its defaults, survives a short fit with eval, and closes twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cadence import Trainer
from cadence.config.registry import algorithms, callbacks, loggers
from tests.common.models import SimpleModel, make_dataloader

# Constructor arguments for components that need some; everything else uses its defaults.
REQUIRED_KWARGS: dict[str, dict[str, Any]] = {
    # SimpleModel's eval metric; patience 1ep cannot run out in a 2-epoch run, and accuracy
    # never exceeds 2, so neither stopper ends the run early.
    "early_stopper": {"monitor": "MulticlassAccuracy", "dataloader_label": "eval"},
    "threshold_stopper": {"monitor": "MulticlassAccuracy", "dataloader_label": "eval",
                          "threshold": 2.0},
}


def _fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **components: Any) -> Trainer:
    monkeypatch.chdir(tmp_path)
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=3),
                      eval_dataloader=make_dataloader(num_batches=2, seed=1), max_duration="2ep",
                      eval_interval="2ba", progress_bar=False, seed=0, run_name="contract",
                      log_interval="1ba", **components)
    trainer.fit()
    return trainer


@pytest.mark.parametrize("name", algorithms.names())
def test_algorithm_contract(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    algorithm = algorithms.get(name)(**REQUIRED_KWARGS.get(name, {}))
    trainer = _fit(tmp_path, monkeypatch, algorithms=[algorithm])
    assert trainer.state.timestamp.batch == 6
    assert all(torch.isfinite(p).all() for p in trainer.state.model.parameters())
    trainer.close()
    trainer.close()
    algorithm.load_state_dict(algorithm.state_dict())


@pytest.mark.parametrize("name", callbacks.names())
def test_callback_contract(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    callback = callbacks.get(name)(**REQUIRED_KWARGS.get(name, {}))
    trainer = _fit(tmp_path, monkeypatch, callbacks=[callback])
    assert trainer.state.timestamp.batch == 6
    trainer.close()
    trainer.close()
    callback.load_state_dict(callback.state_dict())


@pytest.mark.parametrize("name", loggers.names())
def test_logger_contract(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    destination = loggers.get(name)(**REQUIRED_KWARGS.get(name, {}))
    trainer = _fit(tmp_path, monkeypatch, loggers=[destination])
    assert trainer.state.timestamp.batch == 6
    trainer.close()
    trainer.close()


def test_there_is_something_to_test() -> None:
    assert "gradient_clipping" in algorithms.names()
    assert len(callbacks.names()) >= 2 and len(loggers.names()) >= 3
