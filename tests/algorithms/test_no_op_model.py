"""NoOpModel: the Trainer's model becomes a one-weight NoOpModelClass at INIT, the optimizer
steps that weight, training and evaluation run on (x, y) batches."""

from __future__ import annotations

import pytest
import torch

from cadence import Trainer
from cadence.algorithms import NoOpModel
from cadence.algorithms.no_op_model.no_op_model import NoOpModelClass
from tests.common.models import SimpleModel, make_dataloader


def test_trainer_trains_the_single_weight_towards_one() -> None:
    model = SimpleModel(num_classes=2)  # BinaryAccuracy: targets in {0, 1}
    decay, no_decay = list(model.net[0].parameters()), list(model.net[2].parameters())
    optimizer = torch.optim.SGD([{"params": decay, "weight_decay": 0.1},
                                 {"params": no_decay}], lr=0.05)
    trainer = Trainer(model=model, train_dataloader=make_dataloader(num_batches=4, num_classes=2),
                      eval_dataloader=make_dataloader(num_batches=2, num_classes=2), max_duration="2ep",
                      algorithms=[NoOpModel()], optimizers=optimizer, progress_bar=False,
                      seed=0, device="cpu")
    noop = trainer.state.model
    assert isinstance(noop, NoOpModelClass) and noop.num_classes == 2
    assert [len(g["params"]) for g in optimizer.param_groups] == [1, 0]
    assert optimizer.param_groups[0]["params"][0] is noop.weights
    trainer.fit()
    # loss = mean((y * w - y)^2): w moves from 1.5 towards 1
    assert 1.0 < float(noop.weights.detach()) < 1.5
    assert all(p.grad is None for p in model.parameters())  # the old model no longer runs
    metrics = trainer.eval()
    assert any("BinaryAccuracy" in key for key in metrics)


def test_outputs_and_bad_batches() -> None:
    noop = NoOpModelClass(SimpleModel())
    y = torch.tensor([0, 1, 2])
    torch.testing.assert_close(noop((torch.zeros(3, 8), y)), y * 1.5)
    assert torch.equal(noop.eval_forward((torch.zeros(3, 8), y)), y)
    assert float(noop.loss(noop((None, y)), (None, y)).detach()) == pytest.approx(((0.5 * y) ** 2).float().mean())
    with pytest.raises(TypeError, match="inputs, targets"):
        noop({"input_ids": y})
    assert NoOpModel().events is not None and repr(NoOpModel()) == "NoOpModel()"
