"""LowPrecisionLayerNorm / LowPrecisionGroupNorm: under autocast the norms return the
autocast dtype (stock ones return fp32), outside autocast nothing changes, fp32 runs are left
alone with Composer's NoEffectWarning, and both train through the Trainer under amp_bf16
(LayerNorm also on 2 FSDP2 ranks)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from cadence import Callback, Event, State, dist
from cadence.algorithms import (
    LowPrecisionGroupNorm,
    LowPrecisionLayerNorm,
    apply_low_precision_groupnorm,
    apply_low_precision_layernorm,
)
from cadence.algorithms.low_precision_groupnorm.low_precision_groupnorm import LPGroupNorm
from cadence.algorithms.low_precision_layernorm.low_precision_layernorm import LPLayerNorm
from cadence.algorithms.warnings import NoEffectWarning
from cadence.models.tasks.classification import ComposerClassifier
from tests.algorithms.algorithm_helpers import run_trainer, tiny_gpt


def _layernorm_net() -> nn.Sequential:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4))
    with torch.no_grad():  # non-trivial affine parameters
        net[1].weight.uniform_(0.5, 1.5)
        net[1].bias.uniform_(-0.5, 0.5)
    return net


def test_lp_layernorm_runs_in_the_autocast_dtype_with_the_same_parameters() -> None:
    net = _layernorm_net()
    weight, x = net[1].weight, torch.randn(4, 8)
    hidden = net[0](x).detach()  # fp32, as a residual stream is
    with torch.autocast("cpu", dtype=torch.bfloat16):
        stock = net[1](hidden)
    reference = net(x)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    apply_low_precision_layernorm(net, "amp_bf16", optimizer)
    assert type(net[1]) is LPLayerNorm and net[1].weight is weight  # same Parameter
    assert len(optimizer.param_groups[0]["params"]) == 6
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = net[1](hidden)
    assert stock.dtype == torch.float32  # autocast leaves layer_norm in fp32
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), stock, atol=0.05, rtol=0.02)
    assert torch.equal(net(x), reference)  # outside autocast: exactly nn.LayerNorm


def test_lp_groupnorm_runs_in_the_autocast_dtype() -> None:
    torch.manual_seed(0)
    norm = nn.GroupNorm(2, 8)
    x = torch.randn(2, 8, 4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        stock = norm(x)
    model = nn.Sequential(norm)
    apply_low_precision_groupnorm(model, "amp_fp16")
    assert type(model[0]) is LPGroupNorm and model[0].weight is norm.weight
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = model[0](x)
    assert stock.dtype == torch.float32 and low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), stock, atol=0.05, rtol=0.02)


@pytest.mark.parametrize("apply", [apply_low_precision_layernorm, apply_low_precision_groupnorm])
def test_fp32_is_a_no_op_with_composers_warning(apply: Any) -> None:
    net = nn.Sequential(nn.LayerNorm(4), nn.GroupNorm(2, 4))
    with pytest.warns(NoEffectWarning, match="only applies to amp_fp16 and amp_bf16"):
        apply(net, "fp32")
    assert type(net[0]) is nn.LayerNorm and type(net[1]) is nn.GroupNorm
    with pytest.warns(NoEffectWarning, match="no torch.nn"):
        apply(nn.Sequential(nn.Linear(2, 2)), "amp_bf16")
    with pytest.raises(ValueError, match="precision 'fp8' is not one of"):
        apply(net, "fp8")


def test_apply_at_is_checked() -> None:
    assert LowPrecisionLayerNorm("after_load").apply_at == Event.AFTER_LOAD
    assert LowPrecisionGroupNorm().apply_at == Event.INIT
    with pytest.raises(ValueError, match="apply_at='fit_start' is not supported; use one of "
                                         "init, before_load, after_load"):
        LowPrecisionLayerNorm(apply_at="fit_start")


class Losses(Callback):
    def __init__(self) -> None:
        self.values: list[float] = []

    def after_train_batch(self, state: State, logger: Any) -> None:
        loss = state.loss.detach().clone()
        dist.all_reduce(loss)
        self.values.append(float(loss) / dist.get_world_size())


def test_trainer_layernorm_under_amp_bf16() -> None:
    model, losses = tiny_gpt(), Losses()
    run_trainer(model, [LowPrecisionLayerNorm()], steps=6, precision="amp_bf16",
                callbacks=[losses])
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == 5 and all(type(m) is LPLayerNorm for m in norms)
    assert losses.values[-1] < losses.values[0] - 0.3


def test_trainer_fp32_leaves_the_model_alone() -> None:
    model = tiny_gpt()
    with pytest.warns(NoEffectWarning):
        run_trainer(model, [LowPrecisionLayerNorm()], steps=1)
    assert not any(isinstance(m, LPLayerNorm) for m in model.modules())


def test_trainer_groupnorm_under_amp_bf16() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    model, losses = ComposerClassifier(net, num_classes=4), Losses()
    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(8, 3, 6, 6, generator=gen),
                         torch.randint(0, 4, (8,), generator=gen))
    run_trainer(model, [LowPrecisionGroupNorm()], steps=8, precision="amp_bf16",
                callbacks=[losses], train_dataloader=DataLoader(data, batch_size=8))
    assert type(net[1]) is LPGroupNorm
    assert losses.values[-1] < losses.values[0]


@pytest.fixture(scope="module")
def single_process_losses() -> list[float]:
    losses = Losses()
    run_trainer(tiny_gpt(), [LowPrecisionLayerNorm()], steps=3, precision="amp_bf16",
                callbacks=[losses])
    return losses.values


@pytest.mark.slow
@pytest.mark.world_size(2)
def test_fsdp_layernorm_matches_one_process(single_process_losses: list[float]) -> None:
    losses = Losses()
    trainer = run_trainer(tiny_gpt(), [LowPrecisionLayerNorm()], steps=3, precision="amp_bf16",
                          callbacks=[losses], parallelism_config={"fsdp": {}})
    assert sum(isinstance(m, LPLayerNorm) for m in trainer.state.model.modules()) == 5
    assert losses.values == pytest.approx(single_process_losses, rel=1e-2)
    # after_load comes after the Trainer has sharded the model: refused, saying where
    with pytest.raises(TypeError, match=r"apply_at=.*already parallelized .* at .*apply_at='init'"):
        run_trainer(tiny_gpt(), [LowPrecisionLayerNorm(apply_at="after_load")], fit=False,
                    precision="amp_bf16", parallelism_config={"fsdp": {}})


@pytest.mark.parametrize("algorithm, args, problem", [
    ("low_precision_layernorm", {"apply_at": "fit_start"}, "apply_at='fit_start' is not supported"),
    ("low_precision_groupnorm", {"apply_at": "eval_end"},
     "apply_at='eval_end' is not supported; use one of init, before_load, after_load"),
    ("gated_linear_units", {"act_fn": "swishy"}, "act_fn='swishy' is not a transformers"),
])
def test_run_file_arguments_are_checked(algorithm: str, args: dict[str, Any], problem: str) -> None:
    from cadence.config.load import ConfigError, load_config
    from tests.algorithms.test_alibi import RUN

    assert load_config({**RUN, "algorithms": {algorithm: {}}}).algorithms == {algorithm: {}}
    with pytest.raises(ConfigError, match=rf"algorithms\.{algorithm}.*{problem}"):
        load_config({**RUN, "algorithms": {algorithm: args}})
