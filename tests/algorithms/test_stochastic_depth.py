"""StochasticDepth: eval scaling, drop rates in both modes, warmup, an exact resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from cadence import Callback, Event
from cadence.algorithms import StochasticDepth, apply_stochastic_depth
from cadence.algorithms.stochastic_depth.stochastic_depth import StochasticBottleneck, is_resnet_bottleneck
from cadence.utils.module_surgery import count_module_instances
from tests.algorithms.vision_helpers import (
    Bottleneck,
    LossRecorder,
    TinyConvNet,
    loss_fell,
    record_applies,
    run_vision_trainer,
    strided_bottleneck,
    tiny_classifier,
    train_losses,
)


def _branch(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = block.relu(block.bn1(block.conv1(x)))
    out = block.relu(block.bn2(block.conv2(out)))
    return block.bn3(block.conv3(out))


def test_structure_match_does_not_need_torchvision() -> None:
    assert is_resnet_bottleneck(Bottleneck(16, 4))

    class Other(nn.Module):  # the right parts under another class name
        def __init__(self) -> None:
            super().__init__()
            for part in ("conv1", "bn1", "conv2", "bn2", "conv3", "bn3", "relu"):
                setattr(self, part, nn.Identity())
            self.downsample = None

    assert not is_resnet_bottleneck(Other())


@pytest.mark.parametrize("method", ["block", "sample"])
def test_eval_scales_the_branch_by_the_keep_probability(method: str) -> None:
    torch.manual_seed(0)
    block = strided_bottleneck().eval()
    x = torch.randn(2, 16, 8, 8)
    expected = torch.relu(0.7 * _branch(block, x) + block.downsample(x))
    stochastic = StochasticBottleneck(block, drop_rate=0.3, stochastic_method=method).eval()
    torch.testing.assert_close(stochastic(x), expected)
    # drop rate 0: exactly the original block
    plain = StochasticBottleneck(block, drop_rate=0.0, stochastic_method=method).eval()
    torch.testing.assert_close(plain(x), block(x), rtol=0, atol=0)


def test_block_mode_drops_whole_blocks_at_the_rate() -> None:
    torch.manual_seed(0)
    block = StochasticBottleneck(Bottleneck(16, 4), drop_rate=0.3).train()
    x = torch.rand(2, 16, 4, 4)
    dropped = sum(bool(torch.equal(block(x), x)) for _ in range(400))
    assert 0.22 * 400 < dropped < 0.38 * 400
    # a dropped strided block still downsamples: relu(downsample(x))
    strided = StochasticBottleneck(strided_bottleneck(), drop_rate=1.0).train()
    torch.testing.assert_close(strided(x), torch.relu(strided.downsample(x)))


def test_sample_mode_drops_single_samples_at_the_rate() -> None:
    torch.manual_seed(0)
    block = StochasticBottleneck(Bottleneck(16, 4), drop_rate=0.4,
                                 stochastic_method="sample").train()
    x = torch.rand(1000, 16, 2, 2)  # >= 0, so relu(x) == x for a dropped sample
    out = block(x)
    dropped = (out == x).flatten(1).all(dim=1).float().mean()
    assert 0.35 < float(dropped) < 0.45


def test_apply_linear_distribution_and_idempotence() -> None:
    net = TinyConvNet(num_blocks=4)
    params = {id(p) for p in net.parameters()}
    keys = set(net.state_dict())
    apply_stochastic_depth(net, "ResNetBottleneck", drop_rate=0.2)
    blocks = [m for m in net.modules() if isinstance(m, StochasticBottleneck)]
    assert [round(b.drop_rate, 6) for b in blocks] == [0.05, 0.1, 0.15, 0.2]
    assert {id(p) for p in net.parameters()} == params and set(net.state_dict()) == keys
    apply_stochastic_depth(net, "ResNetBottleneck", drop_distribution="uniform")
    assert count_module_instances(net, StochasticBottleneck) == 4


@pytest.mark.parametrize("kwargs, match", [
    ({"target_layer_name": "BasicBlock"}, "target_layer_name"),
    ({"target_layer_name": "ResNetBottleneck", "drop_rate": 1.5}, "drop_rate"),
    ({"target_layer_name": "ResNetBottleneck", "stochastic_method": "layer"}, "stochastic_method"),
    ({"target_layer_name": "ResNetBottleneck", "drop_distribution": "cosine"}, "drop_distribution"),
    ({"target_layer_name": "ResNetBottleneck", "drop_warmup": "soon"}, "drop_warmup"),
    ({"target_layer_name": "ResNetBottleneck", "stochastic_method": "sample",
      "drop_warmup": 0.1}, "drop_warmup"),
])
def test_bad_arguments_are_named(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        StochasticDepth(**kwargs)


class _DeepestRate(Callback):
    """The deepest stochastic block's drop rate at each BATCH_START (after the algorithm)."""

    def __init__(self) -> None:
        self.rates: list[float] = []

    def batch_start(self, state: Any, logger: Any) -> None:
        blocks = [m for m in state.model.modules() if isinstance(m, StochasticBottleneck)]
        self.rates.append(blocks[-1].drop_rate)


def test_warmup_ramps_the_rate_in_a_trainer() -> None:
    algorithm = StochasticDepth("ResNetBottleneck", drop_rate=0.4, drop_warmup="4ba")
    applied = record_applies(algorithm)
    rates = _DeepestRate()
    trainer = run_vision_trainer(tiny_classifier(num_blocks=2), [algorithm], steps=16,
                                 callbacks=[LossRecorder(), rates])
    assert applied == [Event.INIT] + [Event.BATCH_START] * 16
    assert count_module_instances(trainer.state.model, StochasticBottleneck) == 2
    assert rates.rates[:6] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.4])
    assert algorithm.state_dict() == {"num_stochastic_layers": 2, "current_drop_rate": 0.4}
    assert loss_fell(train_losses(trainer))


def test_resume_is_exact(tmp_path: Path) -> None:
    def trainer(**kwargs: Any) -> Any:
        algorithm = StochasticDepth("ResNetBottleneck", drop_rate=0.5, drop_warmup="0.5dur")
        return run_vision_trainer(tiny_classifier(num_blocks=3), [algorithm], steps=8,
                                  fit=False, save_folder=str(tmp_path), run_name="sd",
                                  save_interval="3ba", callbacks=[LossRecorder()], **kwargs)

    straight = trainer()
    straight.fit()
    (checkpoint,) = tmp_path.glob("ep0-ba3*.pt")  # (the name may carry the rank)
    resumed = trainer(load_path=str(checkpoint), save_overwrite=True)
    payload = torch.load(checkpoint, weights_only=True)
    saved = dict(payload.get("state", payload)["algorithms"])["StochasticDepth"]
    assert saved == {"num_stochastic_layers": 3, "current_drop_rate": 0.25}  # at batch 3 of 8
    resumed.fit()
    assert train_losses(resumed) == train_losses(straight)[3:]
    for (name, a), (_, b) in zip(straight.state.model.named_parameters(),
                                 resumed.state.model.named_parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


@pytest.mark.slow
@pytest.mark.world_size(2)
@pytest.mark.parametrize("parallelism", [None, {"fsdp": {}}])
def test_block_mode_with_two_ranks(parallelism: Any) -> None:
    # each rank drops its own blocks, so a block's parameters get gradients on one rank only
    algorithm = StochasticDepth("ResNetBottleneck", drop_rate=0.9, drop_distribution="uniform")
    trainer = run_vision_trainer(tiny_classifier(num_blocks=2), [algorithm], steps=8,
                                 callbacks=[LossRecorder()], parallelism_config=parallelism)
    assert count_module_instances(trainer.state.model, StochasticBottleneck) == 2
    assert loss_fell(train_losses(trainer))
