"""Gradient accumulation: microbatched gradients equal the full-batch gradient."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from cadence import Callback, State, Trainer
from tests.common.models import SimpleModel, make_dataloader


class GradCapture(Callback):
    """Copies the gradients at AFTER_TRAIN_BATCH (final for the step, before the optimizer)."""

    def __init__(self) -> None:
        self.grads: list[dict[str, torch.Tensor]] = []

    def after_train_batch(self, state: State, logger: Any) -> None:
        self.grads.append({n: p.grad.detach().clone() for n, p in state.model.named_parameters()})


def first_step_grads(microbatch_size: int | None) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = SimpleModel()
    capture = GradCapture()
    trainer = Trainer(model=model, train_dataloader=make_dataloader(num_batches=1, batch_size=10),
                      max_duration="1ba", device_train_microbatch_size=microbatch_size,
                      callbacks=[capture], progress_bar=False, seed=0,
                      optimizers=torch.optim.SGD(model.parameters(), lr=0.1))
    trainer.fit()
    return capture.grads[0]


@pytest.mark.parametrize("microbatch_size", [1, 3, 5, 10])
def test_microbatched_gradients_equal_full_batch(microbatch_size: int) -> None:
    full = first_step_grads(None)
    micro = first_step_grads(microbatch_size)  # 3 -> uneven chunks 3, 3, 3, 1
    for name in full:
        torch.testing.assert_close(micro[name], full[name], rtol=0, atol=1e-6)


def test_loss_falls_on_a_learnable_task() -> None:
    torch.manual_seed(0)
    model = SimpleModel(in_features=8, num_classes=2)
    x = torch.randn(64, 8)
    y = (x[:, 0] > 0).long()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    losses: list[float] = []

    class LossRecorder(Callback):
        def batch_end(self, state: State, logger: Any) -> None:
            losses.append(float(state.total_loss))

    trainer = Trainer(model=model, train_dataloader=loader, max_duration="15ep",
                      device_train_microbatch_size=4, callbacks=[LossRecorder()],
                      optimizers=torch.optim.Adam(model.parameters(), lr=1e-2),
                      progress_bar=False, seed=0)
    trainer.fit()
    assert sum(losses[-4:]) / 4 < 0.5 * sum(losses[:4]) / 4
