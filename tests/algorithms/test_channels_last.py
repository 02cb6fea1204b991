"""ChannelsLast: the memory format of 4-D weights, and a Trainer run."""

from __future__ import annotations

import torch

from cadence import Event
from cadence.algorithms import ChannelsLast, apply_channels_last
from tests.algorithms.vision_helpers import (
    LossRecorder,
    TinyConvNet,
    loss_fell,
    record_applies,
    run_vision_trainer,
    tiny_classifier,
    train_losses,
)


def _four_d(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.ndim == 4]


def test_apply_channels_last_changes_strides_not_values() -> None:
    net = TinyConvNet()
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    ids = {n: id(p) for n, p in net.named_parameters()}
    x = torch.randn(2, 3, 16, 16)
    net.eval()
    expected = net(x)
    spatial = [p for p in _four_d(net) if p.shape[-1] > 1]  # 1x1 kernels fit both formats
    assert spatial and not any(p.is_contiguous(memory_format=torch.channels_last)
                               for p in spatial)
    apply_channels_last(net)
    weights = _four_d(net)
    assert weights and all(p.is_contiguous(memory_format=torch.channels_last) for p in weights)
    for name, param in net.named_parameters():
        assert id(param) == ids[name]  # the same Parameters: optimizers keep working
        torch.testing.assert_close(param.detach(), before[name], rtol=0, atol=0)
    torch.testing.assert_close(net(x), expected)
    out = net.down(torch.randn(2, 16, 8, 8).to(memory_format=torch.channels_last))
    assert out.is_contiguous(memory_format=torch.channels_last)


def test_channels_last_in_a_trainer() -> None:
    algorithm = ChannelsLast()
    applied = record_applies(algorithm)
    trainer = run_vision_trainer(tiny_classifier(), [algorithm], steps=16,
                                 callbacks=[LossRecorder()])
    assert applied == [Event.INIT]
    weights = _four_d(trainer.state.model)
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p in weights)
    assert loss_fell(train_losses(trainer))
