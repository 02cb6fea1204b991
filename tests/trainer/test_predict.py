"""Trainer.predict: Composer's signature, PREDICT_* events, outputs on the CPU in order."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

from cadence import Callback, Event, State, Trainer
from tests.common.events import EventCounter
from tests.common.models import SimpleModel, make_dataloader


class DropoutModel(SimpleModel):
    def __init__(self) -> None:
        super().__init__()
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, batch: Any) -> torch.Tensor:
        return self.net(self.drop(batch[0]))


def _trainer(model: Any, callbacks: Any = ()) -> Trainer:
    return Trainer(model=model, train_dataloader=make_dataloader(num_batches=1),
                   max_duration="1ba", callbacks=list(callbacks), progress_bar=False, seed=0)


def test_signature_matches_composer() -> None:
    params = inspect.signature(Trainer.predict).parameters
    assert list(params) == ["self", "dataloader", "subset_num_batches", "return_outputs"]
    assert params["subset_num_batches"].default == -1
    assert params["return_outputs"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["return_outputs"].default is True


def test_outputs_in_order_in_eval_mode_without_grad() -> None:
    torch.manual_seed(0)
    model = DropoutModel()
    trainer = _trainer(model)
    loader = make_dataloader(num_batches=3, seed=5)
    outputs = trainer.predict(loader)
    assert len(outputs) == 3
    model.eval()
    with torch.no_grad():
        expected = [model((x, y)) for x, y in loader]
    for got, want in zip(outputs, expected):
        assert got.device.type == "cpu" and not got.requires_grad
        assert torch.equal(got, want)  # dropout off: eval mode


def test_training_mode_is_restored_and_subset() -> None:
    trainer = _trainer(SimpleModel())
    trainer.state.model.train()
    outputs = trainer.predict(make_dataloader(num_batches=4), subset_num_batches=2)
    assert len(outputs) == 2
    assert trainer.state.model.training is True
    with pytest.raises(ValueError, match="subset_num_batches"):
        trainer.predict(make_dataloader(), subset_num_batches=-2)


class Writer(Callback):
    """Writes predictions at PREDICT_AFTER_FORWARD, as a prediction-writing callback does."""

    def __init__(self) -> None:
        self.rows = 0

    def predict_after_forward(self, state: State, logger: Any) -> None:
        self.rows += state.outputs.shape[0]


def test_events_and_return_outputs_false() -> None:
    counter, writer = EventCounter(), Writer()
    trainer = _trainer(SimpleModel(), [counter, writer])
    before = len(counter.events)
    assert trainer.predict(make_dataloader(num_batches=2), return_outputs=False) == []
    assert writer.rows == 8  # the callback saw every batch's outputs
    per_batch = [Event.PREDICT_BATCH_START, Event.PREDICT_BEFORE_FORWARD,
                 Event.PREDICT_AFTER_FORWARD, Event.PREDICT_BATCH_END]
    assert counter.events[before:] == [Event.PREDICT_START, *per_batch, *per_batch,
                                       Event.PREDICT_END]
    assert Event.PREDICT_BEFORE_FORWARD.is_before_event
    assert Event.PREDICT_AFTER_FORWARD.is_after_event
    assert Event.PREDICT_START.is_predict and not Event.PREDICT_START.is_eval


def test_predict_timestamp_counts_each_batch_before_predict_batch_end(tmp_path: Any) -> None:
    """Composer's prediction saver names files by ``state.predict_timestamp.batch`` at
    ``PREDICT_BATCH_END``: 1 for the first batch; the timestamp starts again each call."""

    class Saver(Callback):
        def __init__(self) -> None:
            self.seen: list[tuple[int, int]] = []

        def predict_batch_end(self, state: State, logger: Any) -> None:
            stamp = state.predict_timestamp
            self.seen.append((int(stamp.batch), int(stamp.sample)))

    saver = Saver()
    trainer = Trainer(model=SimpleModel(), callbacks=[saver], progress_bar=False)
    loader = make_dataloader(num_batches=2)
    batch_size = len(next(iter(loader))[0])
    assert trainer.predict(loader, return_outputs=False) == []
    trainer.predict(loader, subset_num_batches=1)
    assert saver.seen == [(1, batch_size), (2, 2 * batch_size), (1, batch_size)]
