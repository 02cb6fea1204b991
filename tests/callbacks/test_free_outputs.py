"""FreeOutputs: the training outputs are gone from State after the loss; training goes on."""

from __future__ import annotations

from typing import Any

import torch

from cadence import Callback, Trainer
from cadence.callbacks import FreeOutputs
from cadence.registry import registry
from tests.common.models import SimpleModel, make_dataloader


class _Outputs(Callback):
    def __init__(self) -> None:
        self.after_forward_shapes: list[tuple[int, ...]] = []
        self.after_loss_numel: list[int] = []

    def after_forward(self, state, logger) -> None:  # type: ignore[no-untyped-def]
        self.after_forward_shapes.append(tuple(state.outputs.shape))

    def after_loss(self, state, logger) -> None:  # type: ignore[no-untyped-def]
        self.after_loss_numel.append(state.outputs.numel())  # runs after FreeOutputs


class _NoTrainMetrics(SimpleModel):
    """FreeOutputs is for runs whose training metrics do not read the outputs."""

    def get_metrics(self, is_train: bool = False) -> dict[str, Any]:
        return {} if is_train else super().get_metrics(is_train)


def test_outputs_freed_after_loss_and_model_still_trains() -> None:
    model = _NoTrainMetrics()
    before = model.net[0].weight.detach().clone()
    watcher = _Outputs()
    trainer = Trainer(model=model, train_dataloader=make_dataloader(3), max_duration="3ba",
                      optimizers=torch.optim.SGD(model.parameters(), lr=0.5),
                      callbacks=[FreeOutputs(), watcher], progress_bar=False, device="cpu",
                      seed=0)
    trainer.fit()
    trainer.close()
    assert watcher.after_forward_shapes == [(4, 3)] * 3  # logits existed after forward
    assert watcher.after_loss_numel == [0] * 3  # and were dropped at AFTER_LOSS
    assert not torch.equal(model.net[0].weight, before)  # backward still ran
    assert registry.callbacks.get("free_outputs") is FreeOutputs
