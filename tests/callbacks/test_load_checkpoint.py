"""LoadCheckpoint: a checkpoint's weights arrive in the run at the chosen event."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cadence import Callback, Trainer
from cadence.callbacks import LoadCheckpoint
from cadence.checkpoint.errors import CheckpointError
from cadence.registry import registry
from cadence.core import Event
from cadence.utils.checkpoint import save_checkpoint
from tests.common.models import SimpleModel, make_dataloader


def _trainer(model: SimpleModel, **kwargs: object) -> Trainer:
    return Trainer(model=model, train_dataloader=make_dataloader(2), max_duration="1ba",
                   optimizers=torch.optim.SGD(model.parameters(), lr=0.1), progress_bar=False,
                   device="cpu", seed=0, **kwargs)


@pytest.fixture
def saved(tmp_path: Path) -> tuple[str, dict[str, torch.Tensor]]:
    source = SimpleModel()
    with torch.no_grad():
        for p in source.parameters():
            p.fill_(0.25)  # unlike any fresh initialisation
    trainer = _trainer(source)
    path = save_checkpoint(trainer.state, str(tmp_path / "pretrained.pt"))
    weights = {k: v.clone() for k, v in source.state_dict().items()}
    trainer.close()
    return str(path), weights


class _WeightsAt(Callback):
    def __init__(self, event: Event) -> None:
        self.event, self.seen = event, None

    def run_event(self, event: Event, state: object, logger: object) -> None:
        if event == self.event and self.seen is None:
            self.seen = {k: v.clone() for k, v in state.model.state_dict().items()}


def test_loads_weights_at_before_load(saved: tuple[str, dict[str, torch.Tensor]]) -> None:
    path, weights = saved
    model = SimpleModel()
    trainer = _trainer(model, callbacks=[LoadCheckpoint(path, load_weights_only=True)])
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, weights[key], rtol=0, atol=0)
    trainer.close()


def test_loads_at_a_later_event_by_name(saved: tuple[str, dict[str, torch.Tensor]]) -> None:
    path, weights = saved
    model = SimpleModel()
    before = _WeightsAt(Event.INIT)
    at_batch = _WeightsAt(Event.BATCH_START)
    trainer = _trainer(model, callbacks=[before, LoadCheckpoint(path, load_weights_only=True,
                                                                event="FIT_START"), at_batch])
    assert not torch.equal(model.net[0].weight, weights["net.0.weight"])  # not yet
    trainer.fit()
    for key, value in at_batch.seen.items():
        torch.testing.assert_close(value, weights[key], rtol=0, atol=0)
    trainer.close()


def test_ignore_keys_and_errors(saved: tuple[str, dict[str, torch.Tensor]],
                                tmp_path: Path) -> None:
    path, weights = saved
    model = SimpleModel()
    head = model.net[2].weight.detach().clone()
    trainer = _trainer(model, callbacks=[LoadCheckpoint(
        path, load_weights_only=True, strict_model_weights=False,
        ignore_keys=["model/net.2.*"])])
    assert torch.equal(model.net[2].weight, head)  # ignored: kept
    torch.testing.assert_close(model.net[0].weight, weights["net.0.weight"], rtol=0, atol=0)
    trainer.close()
    with pytest.raises(ValueError, match="'soon'.*before_load"):
        LoadCheckpoint(path, event="soon")
    with pytest.raises(CheckpointError):
        _trainer(SimpleModel(), callbacks=[LoadCheckpoint(str(tmp_path / "missing.pt"))])
    assert registry.callbacks.get("load_checkpoint") is LoadCheckpoint
