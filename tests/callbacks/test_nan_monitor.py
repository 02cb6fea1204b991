from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from cadence import State, Trainer
from cadence.callbacks import NaNMonitor
from cadence.loggers import InMemoryLogger, Logger
from tests.common.models import SimpleModel, make_dataloader


def poisoned_dataloader(num_batches: int, bad_batch: int, batch_size: int = 4) -> DataLoader:
    """Finite inputs except in batch ``bad_batch`` (1-based), whose inputs are NaN, so the
    loss of that batch, and only that one, is NaN."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(num_batches * batch_size, 8, generator=gen)
    y = torch.randint(0, 3, (num_batches * batch_size,), generator=gen)
    x[(bad_batch - 1) * batch_size:bad_batch * batch_size] = math.nan
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False)


def test_stops_the_run_at_the_batch_whose_loss_is_nan() -> None:
    trainer = Trainer(model=SimpleModel(), train_dataloader=poisoned_dataloader(3, bad_batch=2),
                      max_duration="2ep", seed=0, progress_bar=False,
                      callbacks=[NaNMonitor()])
    with pytest.raises(RuntimeError, match=r"not finite at batch 2 \(epoch 1, batch 2 of the "
                                           r"epoch\): the loss is nan"):
        trainer.fit()
    assert trainer.state.timestamp.batch == 1  # batch 2 never stepped
    assert all(torch.isfinite(p).all() for p in trainer.state.model.parameters())
    trainer.close()


class InfFromBatch(SimpleModel):
    """Its loss is inf from training batch ``bad_batch`` (1-based, counted over epochs) on."""

    def __init__(self, bad_batch: int) -> None:
        super().__init__()
        self.bad_batch = bad_batch
        self.forwards = 0

    def forward(self, batch: Any) -> torch.Tensor:
        self.forwards += 1
        return super().forward(batch)

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        loss = super().loss(outputs, batch)
        return loss * math.inf if self.forwards >= self.bad_batch else loss


def test_names_the_global_batch_in_a_later_epoch() -> None:
    trainer = Trainer(model=InfFromBatch(bad_batch=5), train_dataloader=make_dataloader(3),
                      max_duration="3ep", seed=0, progress_bar=False,
                      callbacks=[NaNMonitor()])
    with pytest.raises(RuntimeError, match=r"at batch 5 \(epoch 2, batch 2 of the epoch\): the "
                                           r"loss is inf"):
        trainer.fit()
    trainer.close()


def test_check_interval_skips_batches() -> None:
    state = State(model=torch.nn.Linear(2, 2))
    logger = Logger(state, [InMemoryLogger()])
    monitor = NaNMonitor(check_interval=2)
    state.total_loss = torch.tensor(math.nan)
    monitor.after_train_batch(state, logger)  # batch 1: not checked
    state.timestamp = state.timestamp.to_next_batch(samples=4)
    with pytest.raises(RuntimeError, match="batch 2"):
        monitor.after_train_batch(state, logger)
    state.total_loss = None
    monitor.after_train_batch(state, logger)  # no loss yet (a hand-driven loop): nothing to do


@pytest.mark.parametrize("interval", [0, 1.5, True])
def test_rejects_a_bad_interval(interval: object) -> None:
    with pytest.raises(ValueError, match="check_interval"):
        NaNMonitor(check_interval=interval)  # type: ignore[arg-type]
