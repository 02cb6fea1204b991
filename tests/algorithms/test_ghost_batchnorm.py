"""GhostBatchNorm: per-ghost-batch statistics, running statistics, and a Trainer run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cadence import Event
from cadence.algorithms import GhostBatchNorm, apply_ghost_batchnorm
from cadence.algorithms.ghost_batchnorm.ghost_batchnorm import GhostBatchNorm1d, GhostBatchNorm2d
from cadence.utils.module_surgery import count_module_instances
from tests.algorithms.vision_helpers import (
    LossRecorder,
    TinyConvNet,
    loss_fell,
    record_applies,
    run_vision_trainer,
    tiny_classifier,
    train_losses,
)


def test_each_ghost_batch_is_normalized_with_its_own_statistics() -> None:
    bn = nn.BatchNorm2d(4, affine=False)
    ghost = GhostBatchNorm2d(bn, ghost_batch_size=3)
    # two ghost batches with very different means and scales
    x = torch.cat([torch.randn(3, 4, 5, 5) + 10.0, torch.randn(3, 4, 5, 5) * 4.0 - 2.0])
    out = ghost.train()(x)
    for chunk in out.split(3):
        mean = chunk.mean(dim=(0, 2, 3))
        var = chunk.var(dim=(0, 2, 3), unbiased=False)
        torch.testing.assert_close(mean, torch.zeros(4), atol=1e-5, rtol=0)
        torch.testing.assert_close(var, torch.ones(4), atol=1e-3, rtol=0)
    # plain batch norm over the whole batch would not zero each half's mean
    whole = nn.BatchNorm2d(4, affine=False).train()(x)
    assert whole[:3].mean() > 0.5


def test_running_statistics_move_as_much_as_one_batch_norm_step() -> None:
    bn = nn.BatchNorm1d(2, momentum=0.5)
    ghost = GhostBatchNorm1d(bn, ghost_batch_size=4)
    x = torch.randn(8, 2) + 3.0
    ghost.train()(x)
    assert bn.momentum == 0.5  # restored after the forward
    # each of the 2 chunks used momentum 0.25: 0 -> 0.25 m1 -> 0.75 * 0.25 m1 + 0.25 m2
    m1, m2 = x[:4].mean(0), x[4:].mean(0)
    torch.testing.assert_close(bn.running_mean, 0.75 * 0.25 * m1 + 0.25 * m2)
    assert int(bn.num_batches_tracked) == 2
    # eval uses the running statistics sample by sample: any batch size goes
    assert ghost.eval()(torch.randn(1, 2)).shape == (1, 2)


def test_too_small_a_batch_is_refused_in_training() -> None:
    ghost = GhostBatchNorm1d(nn.BatchNorm1d(2), ghost_batch_size=8)
    with pytest.raises(ValueError, match="ghost_batch_size=8"):
        ghost.train()(torch.randn(4, 2))
    with pytest.raises(ValueError, match="ghost_batch_size"):
        GhostBatchNorm(ghost_batch_size=0)


def test_apply_wraps_every_batchnorm_once_and_keeps_parameters() -> None:
    net = TinyConvNet(num_blocks=1)
    params = {id(p) for p in net.parameters()}
    num_bn = count_module_instances(net, nn.BatchNorm2d)
    apply_ghost_batchnorm(net, ghost_batch_size=2)
    assert count_module_instances(net, GhostBatchNorm2d) == num_bn == 5
    apply_ghost_batchnorm(net, ghost_batch_size=2)
    assert count_module_instances(net, GhostBatchNorm2d) == num_bn
    assert {id(p) for p in net.parameters()} == params
    assert net(torch.randn(4, 3, 16, 16)).shape == (4, 3)


def test_ghost_batchnorm_in_a_trainer() -> None:
    algorithm = GhostBatchNorm(ghost_batch_size=4)
    applied = record_applies(algorithm)
    trainer = run_vision_trainer(tiny_classifier(), [algorithm], steps=16,
                                 callbacks=[LossRecorder()])
    assert applied == [Event.INIT]
    assert count_module_instances(trainer.state.model, GhostBatchNorm2d) == 5
    assert loss_fell(train_losses(trainer))
