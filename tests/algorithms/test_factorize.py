"""Factorize: the low-rank solvers, the factorized modules, the policy, a Trainer run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cadence import Event
from cadence.algorithms import Factorize, apply_factorization
from cadence.algorithms.factorize.factorize import (
    FactorizedConv2d,
    FactorizedLinear,
    factorize_conv2d,
    factorize_matrix,
    factorizing_could_speedup,
)
from cadence.utils.module_surgery import count_module_instances
from tests.algorithms.vision_helpers import (
    LossRecorder,
    loss_fell,
    record_applies,
    run_vision_trainer,
    tiny_classifier,
    train_losses,
)


def _low_rank(rows: int, cols: int, rank: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(rows, rank, generator=gen) @ torch.randn(rank, cols, generator=gen)


def test_factorize_matrix_at_full_rank_reproduces_the_outputs() -> None:
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(200, 12, generator=gen)
    W, b = torch.randn(12, 10, generator=gen), torch.randn(10, generator=gen)
    Y = X @ W + b
    solution = factorize_matrix(X, Y, W, bias=b, rank=12)
    assert solution.rank == -1 and solution.Wb is None  # nothing to gain: one full map
    torch.testing.assert_close(X @ solution.Wa + solution.bias, Y, atol=1e-4, rtol=1e-4)


def test_factorize_matrix_fits_the_outputs_better_than_the_weight_svd() -> None:
    gen = torch.Generator().manual_seed(1)
    # anisotropic inputs: some input directions matter far more than others
    X = torch.randn(500, 16, generator=gen) * torch.logspace(1, -2, 16)
    W = torch.randn(16, 16, generator=gen)
    Y = X @ W
    solution = factorize_matrix(X, Y, W, rank=4, n_iters=5)
    assert solution.rank == 4 and solution.Wa.shape == (16, 4) and solution.Wb.shape == (4, 16)
    # the plain truncated SVD of W ignores which inputs occur
    u, s, vh = torch.linalg.svd(W)
    svd_error = ((X @ (u[:, :4] * s[:4]) @ vh[:4] - Y) ** 2).mean() / Y.var()
    assert solution.nmse < 0.5 * float(svd_error)
    with pytest.raises(ValueError, match="rank"):
        factorize_matrix(X, Y, W, rank=0)


def test_factorized_linear_of_a_low_rank_layer_is_exact() -> None:
    gen = torch.Generator().manual_seed(2)
    linear = nn.Linear(64, 48)
    with torch.no_grad():
        linear.weight.copy_(_low_rank(48, 64, 5, gen))
    factorized = FactorizedLinear.from_linear(linear, latent_features=5)
    assert factorized.latent_features == 5
    assert factorized.module0.weight.shape == (5, 64) and factorized.module1.weight.shape == (48, 5)
    x = torch.randn(7, 64, generator=gen)
    torch.testing.assert_close(factorized(x), linear(x), atol=1e-4, rtol=1e-4)
    # lower the rank on sample inputs: still a good fit of the rank-5 map's main directions
    factorized.set_rank(x.repeat(10, 1) + 0.01 * torch.randn(70, 64, generator=gen), 3)
    assert factorized.latent_features == 3 and factorized(x).shape == (7, 48)
    with pytest.raises(ValueError, match="exceeds the current rank"):
        factorized.set_rank(x, 4)
    with pytest.raises(ValueError, match="latent_features=40 is too large"):
        FactorizedLinear(64, 48, latent_features=40)


def test_factorized_conv_of_a_low_rank_conv_is_exact() -> None:
    gen = torch.Generator().manual_seed(3)
    conv = nn.Conv2d(8, 12, 3, stride=2, padding=1)
    with torch.no_grad():
        conv.weight.copy_(_low_rank(12, 8 * 9, 3, gen).reshape(12, 8, 3, 3))
    factorized = FactorizedConv2d.from_conv2d(conv, latent_channels=3)
    assert factorized.module0.weight.shape == (3, 8, 3, 3)
    assert factorized.module1.weight.shape == (12, 3, 1, 1)
    x = torch.randn(2, 8, 9, 9, generator=gen)
    torch.testing.assert_close(factorized(x), conv(x), atol=1e-4, rtol=1e-4)
    # the solver on conv patches: rank 3 recovers the rank-3 conv exactly
    solution = factorize_conv2d(x, conv.weight, rank=3, biasA=conv.bias, padding=1)
    assert solution.rank == 3 and solution.nmse < 1e-4  # float32 round-off only
    assert solution.Wa.shape == (3, 8, 3, 3) and solution.Wb.shape == (12, 3, 1, 1)


def test_speedup_rule() -> None:
    # a square linear breaks even at half its width
    assert factorizing_could_speedup(nn.Linear(64, 64), 31)
    assert not factorizing_could_speedup(nn.Linear(64, 64), 32)
    # a 3x3 conv allows a much wider latent space than a 1x1 one
    assert factorizing_could_speedup(nn.Conv2d(64, 64, 3), 50)
    assert not factorizing_could_speedup(nn.Conv2d(64, 64, 1), 50)
    assert not factorizing_could_speedup(nn.Conv2d(64, 64, 3, groups=2), 4)


def test_apply_factorization_policy_and_idempotence() -> None:
    model = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.Conv2d(32, 8, 1), nn.Flatten(),
                          nn.Linear(8 * 16, 64), nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    apply_factorization(model, min_channels=16, latent_channels=0.25, min_features=32,
                        latent_features=0.25, optimizers=optimizer)
    # the 32->32 conv and the 128->64 linear are wide enough; the others are not
    assert count_module_instances(model, FactorizedConv2d) == 1
    assert count_module_instances(model, FactorizedLinear) == 1
    assert isinstance(model[0], FactorizedConv2d) and model[0].latent_channels == 8
    assert isinstance(model[3], FactorizedLinear) and model[3].latent_features == 16
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {
        id(p) for p in model.parameters()}
    apply_factorization(model, min_channels=1, latent_channels=0.25, min_features=1,
                        latent_features=0.25)  # the factors are not factorized again
    assert count_module_instances(model, FactorizedConv2d) == 2  # the 32->8 1x1 conv now
    assert model(torch.randn(2, 32, 4, 4)).shape == (2, 4)
    with pytest.raises(ValueError, match="latent_channels"):
        Factorize(latent_channels=0)


def test_factorize_in_a_trainer() -> None:
    algorithm = Factorize(min_channels=16, latent_channels=4, min_features=256)
    applied = record_applies(algorithm)
    trainer = run_vision_trainer(tiny_classifier(), [algorithm], steps=16,
                                 callbacks=[LossRecorder()])
    assert applied == [Event.INIT]
    model = trainer.state.model
    # only the 16 -> 32 stride-2 conv is wide enough
    assert count_module_instances(model, FactorizedConv2d) == 1
    assert count_module_instances(model, FactorizedLinear) == 0
    factor = model.module.down.module0.weight
    assert factor.shape == (4, 16, 3, 3)
    assert any(factor is p for g in trainer.state.optimizers[0].param_groups for p in g["params"])
    assert loss_fell(train_losses(trainer))
