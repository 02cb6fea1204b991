"""BlurPool: the blur's invariants, the replacement policy, and a Trainer run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cadence import Event
from cadence.algorithms import BlurPool, apply_blurpool
from cadence.algorithms.warnings import NoEffectWarning
from cadence.algorithms.blurpool.blurpool import (
    BlurConv2d,
    BlurMaxPool2d,
    BlurPool2d,
    blur_2d,
    blurmax_pool2d,
)
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


def test_blur_keeps_a_constant_image_and_removes_the_highest_frequency() -> None:
    constant = torch.full((2, 3, 9, 9), 0.7)
    blurred = blur_2d(constant)
    assert blurred.shape == constant.shape
    torch.testing.assert_close(blurred[..., 1:-1, 1:-1], constant[..., 1:-1, 1:-1])
    # a +-1 checkerboard (Nyquist frequency) is cancelled exactly away from the border
    idx = torch.arange(9)
    checker = ((idx[:, None] + idx[None, :]) % 2 * 2 - 1).float().expand(1, 2, 9, 9)
    assert blur_2d(checker)[..., 1:-1, 1:-1].abs().max() < 1e-6
    assert blur_2d(constant, stride=2).shape == (2, 3, 5, 5)


def test_blur_rejects_bad_filters() -> None:
    with pytest.raises(ValueError, match="odd"):
        blur_2d(torch.ones(1, 1, 4, 4), filter=torch.ones(1, 1, 2, 2))
    with pytest.raises(ValueError, match="filter must be"):
        blur_2d(torch.ones(1, 3, 4, 4), filter=torch.ones(2, 1, 3, 3))


def test_blurmax_pool_matches_max_pool_shapes_and_lowpasses() -> None:
    x = torch.randn(2, 4, 16, 16)
    out = blurmax_pool2d(x, kernel_size=2, stride=2)
    assert out.shape == F.max_pool2d(x, 2).shape
    assert BlurMaxPool2d(2)(x).shape == out.shape
    assert BlurPool2d()(x).shape == (2, 4, 8, 8)
    # the blurred max lies between the min and max of the stride-1 maxes
    maxes = F.max_pool2d(x, 2, stride=1)
    assert out.max() <= maxes.max() + 1e-6


@pytest.mark.parametrize("blur_first", [True, False])
def test_blur_conv_keeps_the_conv_parameters_and_output_shape(blur_first: bool) -> None:
    conv = nn.Conv2d(16, 8, 3, stride=2, padding=1)
    blurred = BlurConv2d.from_conv2d(conv, blur_first=blur_first)
    assert blurred.conv.weight is conv.weight and blurred.conv.bias is conv.bias
    x = torch.randn(2, 16, 8, 8)
    assert blurred(x).shape == conv(x).shape == (2, 8, 4, 4)
    # blurring a constant input (away from the zero padding) leaves the conv output alone
    const = torch.ones(1, 16, 12, 12)
    torch.testing.assert_close(blurred(const)[..., 1:-1, 1:-1], conv(const)[..., 1:-1, 1:-1])


def test_apply_blurpool_policy_and_idempotence() -> None:
    net = TinyConvNet()
    x = torch.randn(2, 3, 16, 16)
    apply_blurpool(net)
    # the max-pool and the 16-channel stride-2 conv; not the 3-channel stem, not stride 1
    assert count_module_instances(net, BlurMaxPool2d) == 1
    assert count_module_instances(net, BlurConv2d) == 1
    assert isinstance(net.down, BlurConv2d) and isinstance(net.conv1, nn.Conv2d)
    assert net(x).shape == (2, 3)
    apply_blurpool(net)
    assert count_module_instances(net, BlurConv2d) == 1
    assert count_module_instances(net, BlurMaxPool2d) == 1

    wide_only = TinyConvNet()
    with pytest.warns(NoEffectWarning, match="no strided Conv2d with in_channels >= 32"):
        apply_blurpool(wide_only, replace_maxpools=False, min_channels=32)
    assert count_module_instances(wide_only, BlurConv2d) == 0
    with pytest.warns(NoEffectWarning, match="changed nothing"):
        apply_blurpool(nn.Sequential(nn.Linear(2, 2)))


def test_blurpool_arguments_checked() -> None:
    with pytest.raises(ValueError, match="replace_convs and replace_maxpools"):
        BlurPool(replace_convs=False, replace_maxpools=False)


def test_blurpool_in_a_trainer() -> None:
    algorithm = BlurPool()
    applied = record_applies(algorithm)
    model = tiny_classifier()
    trainer = run_vision_trainer(model, [algorithm], steps=16, callbacks=[LossRecorder()])
    assert applied == [Event.INIT]
    assert count_module_instances(trainer.state.model, BlurConv2d) == 1
    assert count_module_instances(trainer.state.model, BlurMaxPool2d) == 1
    assert loss_fell(train_losses(trainer))


@pytest.mark.parametrize("surgery", [
    "cadence.algorithms.blurpool.blurpool:apply_blurpool",
    "cadence.algorithms.squeeze_excite.squeeze_excite:apply_squeeze_excite",
    "cadence.algorithms.ghost_batchnorm.ghost_batchnorm:apply_ghost_batchnorm",
    "cadence.algorithms.weight_standardization.weight_standardization:apply_weight_standardization",
    "cadence.algorithms.factorize.factorize:apply_factorization",
    "cadence.algorithms.stochastic_depth.stochastic_depth:apply_stochastic_depth",
])
def test_surgery_after_sharding_is_refused(surgery: str) -> None:
    """Every surgery of the vision algorithms refuses a model already sharded (FSDP2)."""
    import importlib

    from torch.distributed.fsdp import FSDPModule

    module_name, function = surgery.split(":")
    net = TinyConvNet()
    # what fully_shard does to a module: its class becomes FSDP<class>(FSDPModule, class)
    net.fc.__class__ = type("FSDPLinear", (FSDPModule, nn.Linear), {})
    with pytest.raises(TypeError, match="already parallelized"):
        args = ("ResNetBottleneck",) if function == "apply_stochastic_depth" else ()
        getattr(importlib.import_module(module_name), function)(net, *args)


def test_apply_blurpool_logs_composers_summary(caplog: pytest.LogCaptureFixture) -> None:
    """Composer's docs: "Applied BlurPool to model ResNet. Model now has 1 BlurMaxPool2d and
    6 BlurConv2D layers." The same words, for a ResNet-shaped stem and two strided stages
    (the 3-channel stem conv is below min_channels and stays)."""
    import logging

    from cadence.algorithms.blurpool import apply_blurpool

    class ResNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = torch.nn.Conv2d(3, 16, 7, stride=2, padding=3)
            self.maxpool = torch.nn.MaxPool2d(3, stride=2, padding=1)
            self.stage2 = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
            self.down2 = torch.nn.Conv2d(16, 32, 1, stride=2)

    with caplog.at_level(logging.INFO, logger="cadence.algorithms.blurpool.blurpool"):
        apply_blurpool(ResNet())
    assert "Applied BlurPool to model ResNet. Model now has 1 BlurMaxPool2d and 2 BlurConv2D " \
           "layers." in caplog.text
