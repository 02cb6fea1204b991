"""GyroDropout: Dropout modules are replaced; in training each batch block gets one of tau
masks from a fixed pool of sigma, re-picked every iter_num steps; eval is the identity; a
run resumes with the same masks; bad arguments are refused."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from cadence import Callback, ComposerModel, State, Trainer
from cadence.algorithms import GyroDropout, apply_gyro_dropout
from cadence.algorithms.gyro_dropout.gyro_dropout import GyroDropoutLayer
from cadence.algorithms.warnings import NoEffectWarning
from tests.common.models import make_dataloader


class _DropoutMLP(ComposerModel):
    """``x [batch, 8] -> Linear -> ReLU -> Dropout -> Linear -> logits [batch, 3]``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                       torch.nn.Dropout(0.5), torch.nn.Linear(32, 3))

    def forward(self, batch: Any) -> torch.Tensor:
        return self.net(batch[0])

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return F.cross_entropy(outputs, batch[1])


def _layer(p: float = 0.5, sigma: int = 8, tau: int = 4, iters: int = 16) -> GyroDropoutLayer:
    torch.manual_seed(0)
    return GyroDropoutLayer(iters_per_epoch=iters, max_epoch=1, p=p, sigma=sigma, tau=tau)


def test_blocks_use_tau_masks_from_a_pool_of_sigma() -> None:
    layer = _layer(p=0.5, sigma=8, tau=4, iters=16)  # iter_num = int(16 / 8) * 4 = 8
    assert layer.iter_num == 8
    x = torch.ones(10, 64, 3)  # [batch, features, *]: the mask broadcasts over dim 2
    outputs = [layer(x) for _ in range(16)]
    pool: set[tuple[float, ...]] = set()
    for step, out in enumerate(outputs):
        assert out.shape == x.shape
        assert torch.equal(out[..., 0], out[..., 2])
        kept = out[..., 0]
        assert set(kept.unique().tolist()) <= {0.0, 2.0}  # kept features scaled by 1 / (1-p)
        blocks = [kept[i:i + 3] for i in range(0, 10, math.ceil(10 / 4))]  # 3, 3, 3, 1 rows
        for block in blocks:
            assert (block == block[0]).all()  # one mask per block
            pool.add(tuple(block[0].tolist()))
        if step % 8:  # the same picks until the next multiple of iter_num
            assert torch.equal(out, outputs[step - 1])
    assert not torch.equal(outputs[7], outputs[8])  # re-picked at step 8
    assert 1 < len(pool) <= 8
    assert 0.3 < (outputs[0] == 0).float().mean() < 0.7  # about p of the features dropped
    layer.eval()
    assert torch.equal(layer(x), x)


class _Losses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def batch_end(self, state: State, logger: Any) -> None:
        self.losses.append(float(state.total_loss))


def test_trainer_replaces_dropout_sets_the_length_and_loss_falls() -> None:
    model = _DropoutMLP()
    recorder = _Losses()
    trainer = Trainer(model=model, train_dataloader=make_dataloader(num_batches=4),
                      max_duration="6ep", algorithms=[GyroDropout(p=0.5, sigma=8, tau=2)],
                      optimizers=torch.optim.Adam(model.parameters(), lr=1e-2),
                      callbacks=[recorder], progress_bar=False, seed=0, device="cpu")
    layers = [m for m in model.modules() if isinstance(m, GyroDropoutLayer)]
    assert len(layers) == 1 and not any(isinstance(m, torch.nn.Dropout) for m in model.modules())
    trainer.fit()
    losses = recorder.losses
    assert (layers[0].iters_per_epoch, layers[0].max_epoch) == (4, 6)
    assert layers[0].iter_num == int(4 * 6 / 8) * 2
    assert int(layers[0].training_step) == 24
    assert sum(losses[-4:]) < sum(losses[:4])


def test_resume_keeps_the_masks(tmp_path: Path) -> None:
    def run(**kwargs: Any) -> Trainer:
        torch.manual_seed(0)
        model = _DropoutMLP()
        trainer = Trainer(model=model, train_dataloader=make_dataloader(num_batches=4),
                          max_duration="4ba", algorithms=[GyroDropout(p=0.5, sigma=4, tau=2)],
                          optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
                          progress_bar=False, seed=0, device="cpu",
                          save_folder=str(tmp_path), run_name="gyro", save_interval="2ba",
                          **kwargs)
        trainer.fit()
        return trainer

    straight = run()
    (checkpoint,) = tmp_path.glob("ep0-ba2*.pt")
    resumed = run(load_path=str(checkpoint), save_overwrite=True)
    a, b = straight.state.model.state_dict(), resumed.state.model.state_dict()
    assert any(k.endswith("training_step") for k in a)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_no_dropout_warns_and_bad_arguments_are_refused() -> None:
    with pytest.warns(NoEffectWarning, match="Dropout"):
        apply_gyro_dropout(torch.nn.Linear(2, 2), 10, 1, 0.5, 4, 2)
    for kwargs, match in [({"p": 1.0}, "p must"), ({"sigma": 0}, "sigma"),
                          ({"sigma": 4, "tau": 5}, "tau")]:
        with pytest.raises(ValueError, match=match):
            GyroDropout(**kwargs)
    layer = GyroDropoutLayer(None, None, 0.5, 4, 2)
    with pytest.raises(ValueError, match="iters_per_epoch"):
        layer(torch.ones(4, 3))
    copy.deepcopy(layer)  # plain module state
