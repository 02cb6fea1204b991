"""WeightStandardization: standardized filters, which convs, gradients, a Trainer run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.utils.parametrize as parametrize
from torch import nn

from cadence import Event
from cadence.algorithms import WeightStandardization, apply_weight_standardization
from tests.algorithms.vision_helpers import (
    LossRecorder,
    TinyConvNet,
    loss_fell,
    record_applies,
    run_vision_trainer,
    tiny_classifier,
    train_losses,
)


def _convs(model: nn.Module) -> list[nn.Conv2d]:
    return [m for m in model.modules() if isinstance(m, nn.Conv2d)]


def test_standardized_filters_have_zero_mean_and_unit_variance() -> None:
    conv = nn.Conv2d(4, 6, 3)
    with torch.no_grad():
        conv.weight.mul_(7.0).add_(torch.arange(6.0).reshape(6, 1, 1, 1))
    original = conv.weight
    assert apply_weight_standardization(nn.Sequential(conv)) == 1
    weight = conv.weight  # computed from the parametrization
    torch.testing.assert_close(weight.mean(dim=(1, 2, 3)), torch.zeros(6), atol=1e-5, rtol=0)
    torch.testing.assert_close(weight.var(dim=(1, 2, 3), unbiased=False), torch.ones(6),
                               atol=1e-4, rtol=0)
    # the trained tensor is the original Parameter, and gradients reach it
    assert conv.parametrizations.weight.original is original
    conv(torch.randn(2, 4, 5, 5)).square().sum().backward()
    assert original.grad is not None and original.grad.abs().sum() > 0


def test_last_layers_in_execution_order_are_left_alone() -> None:
    net = TinyConvNet()
    # registration order: conv1, block convs (3), down; executed in the same order here
    count = apply_weight_standardization(net, n_last_layers_ignore=1)
    assert count == 4
    assert not parametrize.is_parametrized(net.down)
    assert parametrize.is_parametrized(net.conv1)
    # a second call standardizes only what is left
    assert apply_weight_standardization(net) == 1
    assert all(parametrize.is_parametrized(c) for c in _convs(net))
    with pytest.raises(ValueError, match="n_last_layers_ignore"):
        WeightStandardization(n_last_layers_ignore=-1)


def test_execution_order_beats_registration_order() -> None:
    class Reversed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.last = nn.Conv2d(4, 2, 1)  # registered first, runs last
            self.first = nn.Conv2d(3, 4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.last(self.first(x))

    net = Reversed()
    assert apply_weight_standardization(net, n_last_layers_ignore=1) == 1
    assert parametrize.is_parametrized(net.first) and not parametrize.is_parametrized(net.last)


def test_weight_standardization_in_a_trainer() -> None:
    algorithm = WeightStandardization(n_last_layers_ignore=0)
    applied = record_applies(algorithm)
    trainer = run_vision_trainer(tiny_classifier(groupnorm=True), [algorithm], steps=16,
                                 callbacks=[LossRecorder()])
    assert applied == [Event.INIT]
    convs = _convs(trainer.state.model)
    assert len(convs) == 5 and all(parametrize.is_parametrized(c) for c in convs)
    assert loss_fell(train_losses(trainer))
