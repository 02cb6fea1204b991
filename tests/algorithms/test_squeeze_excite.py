"""SqueezeExcite: the block's shape and gates, the replacement policy, a Trainer run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cadence import Event
from cadence.algorithms import (
    SqueezeExcite,
    SqueezeExcite2d,
    SqueezeExciteConv2d,
    apply_squeeze_excite,
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


def test_se_block_gates_each_channel_in_0_1() -> None:
    torch.manual_seed(0)
    block = SqueezeExcite2d(num_features=8, latent_channels=0.25)
    assert block.latent_channels == 2
    x = torch.randn(3, 8, 5, 5)
    gates = block.gates(x)
    assert gates.shape == (3, 8)
    assert bool(((gates > 0) & (gates < 1)).all())
    out = block(x)
    assert out.shape == x.shape
    torch.testing.assert_close(out, x * gates[:, :, None, None])
    # the gates depend on the channel means only: a spatial shuffle moves the output along
    perm = torch.randperm(25)
    shuffled = x.flatten(2)[..., perm].reshape_as(x)
    torch.testing.assert_close(block(shuffled), out.flatten(2)[..., perm].reshape_as(x))
    assert SqueezeExcite2d(8, latent_channels=3).latent_channels == 3
    with pytest.raises(ValueError, match="latent_channels"):
        SqueezeExcite2d(8, latent_channels=0)


def test_apply_squeeze_excite_policy_and_optimizer() -> None:
    net = TinyConvNet()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    before = sum(len(g["params"]) for g in optimizer.param_groups)
    # min(in, out) >= 16: the down conv (16 -> 32) only; the block convs are 4 wide
    apply_squeeze_excite(net, latent_channels=0.25, min_channels=16, optimizers=optimizer)
    assert count_module_instances(net, SqueezeExciteConv2d) == 1
    assert isinstance(net.down, SqueezeExciteConv2d) and net.down.se.latent_channels == 8
    # the SE block's two Linear weights joined the optimizer; the conv's stayed
    assert sum(len(g["params"]) for g in optimizer.param_groups) == before + 2
    apply_squeeze_excite(net, latent_channels=0.25, min_channels=16)
    assert count_module_instances(net, SqueezeExciteConv2d) == 1
    assert net(torch.randn(2, 3, 16, 16)).shape == (2, 3)
    with pytest.raises(ValueError, match="min_channels"):
        SqueezeExcite(min_channels=-1)


def test_squeeze_excite_in_a_trainer() -> None:
    algorithm = SqueezeExcite(latent_channels=4, min_channels=4)
    applied = record_applies(algorithm)
    model = tiny_classifier()
    trainer = run_vision_trainer(model, [algorithm], steps=16, callbacks=[LossRecorder()])
    assert applied == [Event.INIT]
    # min(in, out) >= 4: the three bottleneck convs and the down conv, not the RGB stem
    assert count_module_instances(trainer.state.model, SqueezeExciteConv2d) == 4
    # the optimizer built before the Trainer (on the old parameters) trains the SE blocks
    se_weight = trainer.state.model.module.down.se.pool_and_mlp[2].weight
    assert any(se_weight is p for g in trainer.state.optimizers[0].param_groups
               for p in g["params"])
    assert loss_fell(train_losses(trainer))


def test_surgeries_together_resume_exactly(tmp_path: Path) -> None:
    """The INIT surgeries of the vision algorithms stack, and a resumed run (surgery again,
    then the checkpoint: the new modules' weights and optimizer state) continues exactly."""
    from cadence.algorithms import BlurPool, Factorize, GhostBatchNorm, WeightStandardization
    from cadence.algorithms.blurpool.blurpool import BlurConv2d
    from cadence.algorithms.factorize.factorize import FactorizedConv2d

    def trainer(**kwargs: Any) -> Any:
        surgeries = [Factorize(min_channels=16, latent_channels=4), BlurPool(),
                     SqueezeExcite(latent_channels=4, min_channels=4),
                     GhostBatchNorm(ghost_batch_size=4), WeightStandardization()]
        return run_vision_trainer(tiny_classifier(), surgeries, steps=6, fit=False,
                                  save_folder=str(tmp_path), run_name="surgery",
                                  save_interval="3ba", callbacks=[LossRecorder()], **kwargs)

    straight = trainer()
    straight.fit()
    (checkpoint,) = tmp_path.glob("ep0-ba3*.pt")  # (the name may carry the rank)
    resumed = trainer(load_path=str(checkpoint), save_overwrite=True)
    resumed.fit()
    assert train_losses(resumed) == train_losses(straight)[3:]
    # the stride-2 conv: factorized, its strided first half blurred, then each half SE'd
    down = resumed.state.model.module.down
    assert isinstance(down, FactorizedConv2d) and isinstance(down.module0, BlurConv2d)
    assert isinstance(down.module0.conv, SqueezeExciteConv2d)
    assert isinstance(down.module1, SqueezeExciteConv2d)
    for (name, a), (_, b) in zip(straight.state.model.named_parameters(),
                                 resumed.state.model.named_parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
