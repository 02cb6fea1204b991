"""Issue 33's behaviours, where llm-foundry 0.22.0 relied on Composer: B1 (``issubclass`` on
``ComposerScheduler``), B2 (``load_ignore_keys=None``), the learning rate each batch uses
(cadence's, not Composer's one-batch lag; README "Coming from Composer"),
``console_log_interval='1ba'``, and the test differences (a single ``Logger`` destination,
``Callback.__init__(*args)``, ``EarlyStopper(monitor='')``, ``Time.from_input('')``)."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from cadence import Callback, Time, TimeUnit, Trainer
from cadence.callbacks import EarlyStopper
from cadence.loggers import InMemoryLogger, Logger
from cadence.optim import ComposerScheduler, CosineAnnealingWithWarmupScheduler, LinearScheduler
from tests.common.models import SimpleModel, make_dataloader


def test_b1_composer_scheduler_is_a_base_class() -> None:
    class InverseSquareRoot(ComposerScheduler):  # as llm-foundry's own scheduler
        def __call__(self, state: Any, ssr: float = 1.0) -> float:
            return 1.0

    assert issubclass(LinearScheduler, ComposerScheduler)
    assert issubclass(InverseSquareRoot, ComposerScheduler)
    assert not issubclass(torch.optim.SGD, ComposerScheduler)
    assert not isinstance(lambda state: 1.0, ComposerScheduler)


def test_b2_load_ignore_keys_none_is_the_default() -> None:
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=1),
                      max_duration="1ba", load_ignore_keys=None, progress_bar=False)
    trainer.fit()
    assert int(trainer.state.timestamp.batch) == 1


class _RatesSeen(Callback):
    def __init__(self) -> None:
        super().__init__()
        self.rates: list[float] = []

    def before_forward(self, state: Any, logger: Any) -> None:
        self.rates.append(state.optimizers[0].param_groups[0]["lr"])


def test_the_rate_at_batch_k_is_the_schedule_at_k() -> None:
    """cadence's per-batch rates under CosineAnnealingWithWarmupScheduler(t_warmup='2ba')
    over 6 batches (lr 6e-4): 0, 3e-4, 6e-4, 5.12e-4, 3.0e-4, 0.88e-4. Composer 0.32 steps
    its schedulers before the batch count advances, so each rate comes one batch late (0, 0,
    3e-4, 6e-4, 5.12e-4, 3.0e-4): the table in README's "Coming from Composer"."""
    seen = _RatesSeen()
    model = SimpleModel()
    trainer = Trainer(model=model, train_dataloader=make_dataloader(num_batches=6),
                      max_duration="6ba", progress_bar=False, callbacks=[seen],
                      optimizers=torch.optim.SGD(model.parameters(), lr=6e-4),
                      schedulers=CosineAnnealingWithWarmupScheduler(t_warmup="2ba"))
    trainer.fit()
    assert seen.rates == pytest.approx([0.0, 3e-4, 6e-4, 5.1213e-4, 3.0e-4, 0.8787e-4],
                                       abs=1e-8)


def test_console_log_interval_1ba_prints_every_batch() -> None:
    """llm-foundry's defaults: progress_bar=False, log_to_console=True,
    console_log_interval='1ba', an evaluator at 100ba."""
    stream = io.StringIO()
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=6),
                      eval_dataloader=make_dataloader(num_batches=1), eval_interval="100ba",
                      max_duration="6ba", progress_bar=False, log_to_console=True,
                      console_log_interval="1ba", console_stream=stream)
    trainer.fit()
    records = [line for line in stream.getvalue().splitlines() if "Train loss/train/total" in line]
    assert len(records) == 6


def test_logger_takes_one_destination() -> None:
    destination = InMemoryLogger()
    state = SimpleNamespace(timestamp=SimpleNamespace(batch=3))
    logger = Logger(state, destinations=destination)  # type: ignore[arg-type]
    assert logger.destinations == [destination]
    logger.log_metrics({"x": 1.0})
    assert destination.data["x"] == [(3, 1.0)] or destination.data["x"][0][1] == 1.0
    assert Logger(state, destinations=None).destinations == []  # type: ignore[arg-type]


def test_callback_init_takes_any_arguments() -> None:
    class WithArgs(Callback):
        def __init__(self, a: int, *, b: str) -> None:
            super().__init__(a, b=b)
            self.a, self.b = a, b

    made = WithArgs(1, b="x")
    assert (made.a, made.b) == (1, "x")


def test_early_stopper_with_an_empty_monitor_is_built_and_refused_at_fit() -> None:
    stopper = EarlyStopper(monitor="")
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=1),
                      eval_dataloader=make_dataloader(num_batches=1), max_duration="1ba",
                      progress_bar=False, callbacks=[stopper])
    with pytest.raises(ValueError, match="metric '' is not computed for 'eval'"):
        trainer.fit()


def test_time_from_an_empty_string_is_zero_seconds() -> None:
    assert Time.from_input("") == Time(0, TimeUnit.SECOND)
    with pytest.raises(ValueError):
        Time.from_input(" ")  # as Composer: only the empty string
