"""Composer's remaining Trainer arguments: python_log_level, deterministic_mode,
precision_config, ddp_sync_strategy, load_exclude_algorithms (and the accepted no-ops)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from cadence import Trainer
from cadence.algorithms import EMA
from tests.common.models import SimpleModel, make_dataloader


def _trainer(**kwargs: object) -> Trainer:
    return Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=2),
                   max_duration="2ba", progress_bar=False, seed=0, **kwargs)


def test_python_log_level_sets_the_cadence_logger() -> None:
    logger = logging.getLogger("cadence")
    before = logger.level
    try:
        _trainer(python_log_level="debug").close()
        assert logger.level == logging.DEBUG
    finally:
        logger.setLevel(before)
    with pytest.raises(ValueError, match="python_log_level='loud'"):
        _trainer(python_log_level="loud")


def test_deterministic_mode_turns_on_deterministic_algorithms() -> None:
    try:
        with pytest.warns(UserWarning, match="Deterministic mode"):
            trainer = _trainer(deterministic_mode=True)
        assert torch.are_deterministic_algorithms_enabled()
        trainer.fit()
        trainer.close()
    finally:
        torch.use_deterministic_algorithms(False)


def test_fp8_precision_config_and_forced_sync_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="precision_config"):
        _trainer(precision_config={"fp8_format": "HYBRID"})
    with pytest.raises(ValueError, match="ddp_sync_strategy='forced_sync'"):
        _trainer(ddp_sync_strategy="forced_sync")
    _trainer(ddp_sync_strategy="multi_auto_sync", spin_dataloaders=False,
             load_progress_bar=False).close()


def test_load_exclude_algorithms_keeps_the_algorithms_fresh_state(tmp_path: Path) -> None:
    source = _trainer(algorithms=[EMA(half_life="1ba")], save_folder=str(tmp_path),
                      run_name="ema", save_interval="2ba")
    source.fit()
    saved = source.state.algorithms[0].state_dict()
    source.close()
    path = tmp_path / "ep0-ba2-rank0.pt"
    kept = _trainer(algorithms=[EMA(half_life="1ba")], load_path=str(path))
    restored = kept.state.algorithms[0].state_dict()
    assert restored["last_update"] == saved["last_update"] and restored["ema_started"]
    kept.close()
    fresh = _trainer(algorithms=[EMA(half_life="1ba")], load_path=str(path),
                     load_exclude_algorithms=["EMA"])
    assert not fresh.state.algorithms[0].state_dict()["ema_started"]  # as if never saved
    assert fresh.state.timestamp.batch == 2  # the rest of the checkpoint did load
    fresh.close()
