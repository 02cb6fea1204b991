"""Issue 25, item 5: strict means strict. A 2-layer checkpoint loaded into a 3-layer model
with ``load_weights_only`` (``load_strict_model_weights`` at its default, true) is refused
before any training, naming the missing keys and how to load non-strictly; not strict, it
loads what fits; a shape mismatch is refused either way unless its key is ignored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from cadence import ComposerModel, Trainer
from cadence.checkpoint import CheckpointError
from tests.common.models import make_dataloader


class Deep(ComposerModel):
    """``n`` hidden Linear layers of width ``width``, then a classifier head."""

    def __init__(self, n: int = 2, width: int = 8) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(
            [torch.nn.Linear(8 if i == 0 else width, width) for i in range(n)])
        self.head = torch.nn.Linear(width, 3)

    def forward(self, batch: Any) -> torch.Tensor:
        x = batch[0]
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return F.cross_entropy(outputs, batch[1])


def _trainer(model: Deep, **kwargs: Any) -> Trainer:
    loader = DataLoader(make_dataloader(num_batches=2, batch_size=4).dataset, batch_size=4)
    return Trainer(model=model, train_dataloader=loader, max_duration="2ba",
                   progress_bar=False, run_name="strict", seed=1, **kwargs)


def _two_layer_checkpoint(folder: Path, fmt: str) -> Path:
    torch.manual_seed(0)
    trainer = _trainer(Deep(2), save_folder=str(folder), save_interval="1ba",
                       save_state_dict_type=fmt)
    trainer.fit()
    trainer.close()
    return folder / ("ep0-ba2-rank0.pt" if fmt == "full" else "ep0-ba2")


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_two_layer_checkpoint_into_three_layer_model_is_refused(tmp_path: Path,
                                                                fmt: str) -> None:
    path = _two_layer_checkpoint(tmp_path / "run", fmt)
    model = Deep(3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError) as info:
        _trainer(model, load_path=str(path), load_weights_only=True)
    message = str(info.value)
    assert str(path) in message and "load_strict_model_weights is true" in message
    assert "2 in the model but not in the checkpoint: layers.2.bias, layers.2.weight" in message
    assert "load_strict_model_weights: false" in message and "load_ignore_keys" in message
    # refused before anything loaded
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())

    # not strict: what fits loads, layer 2 keeps its initial values
    model = Deep(3)
    fresh = model.layers[2].weight.detach().clone()
    trainer = _trainer(model, load_path=str(path), load_weights_only=True,
                       load_strict_model_weights=False)
    saved = _trainer(Deep(2), load_path=str(path), load_weights_only=True).state.model
    assert torch.equal(trainer.state.model.layers[0].weight, saved.layers[0].weight)
    assert torch.equal(trainer.state.model.layers[2].weight, fresh)
    # ignoring the model's extra keys is strict about the rest, and loads
    _trainer(Deep(3), load_path=str(path), load_weights_only=True,
             load_ignore_keys=["model/layers.2.*"])


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_unexpected_keys_and_shape_mismatches_are_named(tmp_path: Path, fmt: str) -> None:
    path = _two_layer_checkpoint(tmp_path / "run", fmt)
    with pytest.raises(CheckpointError, match=r"2 in the checkpoint but not in the model: "
                                              r"layers\.1\.bias, layers\.1\.weight"):
        _trainer(Deep(1), load_path=str(path), load_weights_only=True)
    with pytest.raises(CheckpointError) as info:  # shapes: refused even when not strict
        _trainer(Deep(2, width=4), load_path=str(path), load_weights_only=True,
                 load_strict_model_weights=False)
    assert "with another shape: head.weight (checkpoint [3, 8], model [3, 4])" in str(info.value)
    assert "load_ignore_keys" in str(info.value)
