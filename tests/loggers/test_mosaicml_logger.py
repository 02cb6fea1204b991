"""``MosaicMLLogger``: Composer's constants; off the platform it is disabled and a run with it
trains as without it; with the platform's variables set it is refused, naming them."""

from __future__ import annotations

import logging

import pytest

from cadence import Trainer
from cadence.loggers import InMemoryLogger, MosaicMLLogger
from cadence.loggers.mosaicml_logger import (
    MOSAICML_ACCESS_TOKEN_ENV_VAR, MOSAICML_PLATFORM_ENV_VAR, RUN_NAME_ENV_VAR,
)
from tests.common.models import SimpleModel, make_dataloader


@pytest.fixture
def off_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (RUN_NAME_ENV_VAR, MOSAICML_PLATFORM_ENV_VAR, MOSAICML_ACCESS_TOKEN_ENV_VAR):
        monkeypatch.delenv(name, raising=False)


def test_constants_are_composers() -> None:
    assert (RUN_NAME_ENV_VAR, MOSAICML_PLATFORM_ENV_VAR, MOSAICML_ACCESS_TOKEN_ENV_VAR) == (
        "RUN_NAME", "MOSAICML_PLATFORM", "MOSAICML_ACCESS_TOKEN_FILE")


def test_disabled_off_the_platform_and_a_run_trains(off_platform: None,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="cadence.loggers.mosaicml_logger"):
        logger = MosaicMLLogger(log_interval=5, ignore_keys=["wall_clock/*"],
                                ignore_exceptions=False)
    assert "RUN_NAME" in caplog.text and "disabled" in caplog.text
    assert logger.ignore_exceptions is False and logger.log_interval == 5
    memory = InMemoryLogger()
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=2),
                      max_duration="2ba", loggers=[logger, memory], progress_bar=False)
    trainer.fit()
    logger.log_metrics({"data_validated": 1.0})  # llm-foundry's calls
    logger._flush_metadata(force_flush=True)
    assert logger.buffered_metadata == {}
    assert int(trainer.state.timestamp.batch) == 2 and memory.data  # the run went on


@pytest.mark.parametrize("env", [{RUN_NAME_ENV_VAR: "my-run"},
                                 {MOSAICML_PLATFORM_ENV_VAR: "True"}])
def test_refused_with_the_platform_variables_set(off_platform: None, env: dict[str, str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(RuntimeError, match=r"RUN_NAME.*MOSAICML_PLATFORM.*mcli"):
        MosaicMLLogger()
