"""Adaptive gradient clipping (Brock et al. 2021) and Composer's
``apply_gradient_clipping(model, clipping_type, clipping_threshold, fsdp_enabled)``."""

from __future__ import annotations

import inspect
import math
from typing import Any

import pytest
import torch

from cadence import Callback, State, Trainer
from cadence.algorithms import GradientClipping, apply_gradient_clipping
from cadence.algorithms.gradient_clipping.gradient_clipping import unitwise_norm
from tests.common.models import SimpleModel, make_dataloader


def test_signature_is_composers() -> None:
    params = inspect.signature(apply_gradient_clipping).parameters
    assert list(params) == ["model", "clipping_type", "clipping_threshold", "fsdp_enabled"]


def test_unitwise_norm_shapes() -> None:
    assert unitwise_norm(torch.tensor([3.0, 4.0])).item() == pytest.approx(5.0)
    w = torch.tensor([[3.0, 4.0], [0.0, 1.0]])
    assert unitwise_norm(w).tolist() == [[5.0], [1.0]]
    assert unitwise_norm(torch.ones(2, 3, 2, 2)).shape == (2, 1, 1, 1)


def test_adaptive_clipping_by_hand() -> None:
    layer = torch.nn.Linear(2, 3)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[3.0, 4.0], [1.0, 0.0], [0.0, 0.0]]))
        layer.bias.copy_(torch.tensor([0.0, 0.0, 2.0]))
    grads = torch.tensor([[6.0, 8.0], [0.01, 0.0], [1.0, 0.0]])  # row norms 10, 0.01, 1
    layer.weight.grad = grads.clone()
    layer.bias.grad = torch.tensor([0.0, 3.0, 4.0])  # norm 5
    apply_gradient_clipping(layer, "adaptive", 0.1, fsdp_enabled=False)
    # row 0: |W| = 5, max 0.5 < 10 -> scaled by 0.05; row 1: 0.01 <= 0.1 -> unchanged;
    # row 2: |W| = 0 -> coefficient 0 (zeroed), as Composer
    expected = torch.tensor([[0.3, 0.4], [0.01, 0.0], [0.0, 0.0]])
    torch.testing.assert_close(layer.weight.grad, expected)
    # bias: |b| = 2, max 0.2 < 5 -> scaled by 0.04
    torch.testing.assert_close(layer.bias.grad, torch.tensor([0.0, 0.12, 0.16]))


def test_zero_weights_and_zero_gradient_stay_zero_not_nan() -> None:
    p = torch.nn.Parameter(torch.zeros(2, 2))
    p.grad = torch.zeros(2, 2)
    apply_gradient_clipping([p], "adaptive", 0.01)
    assert torch.equal(p.grad, torch.zeros(2, 2))


def test_unknown_type_names_adaptive() -> None:
    with pytest.raises(ValueError, match="adaptive"):
        apply_gradient_clipping(torch.nn.Linear(2, 2), "agc", 0.1)
    with pytest.raises(ValueError, match="adaptive"):
        GradientClipping("agc", 0.1)


def test_a_one_element_tuple_names_its_type_as_composers_tests_pass_it() -> None:
    """Composer's ``test_gradient_clipping_algorithm`` passes ``clipping_type=('norm',)``;
    a one-element tuple or list is its element, anything longer is refused by name."""
    for kind in ("adaptive", "norm", "value"):
        assert GradientClipping(clipping_type=(kind,), clipping_threshold=0.01).clipping_type \
            == kind
    layer = torch.nn.Linear(2, 2)
    layer.weight.grad = torch.full((2, 2), 5.0)
    layer.bias.grad = torch.full((2,), 5.0)
    apply_gradient_clipping(layer, ["value"], 1.0)
    assert torch.equal(layer.weight.grad, torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"\('norm', 'value'\).*one of: norm, value, adaptive"):
        GradientClipping(clipping_type=("norm", "value"))


class _Ratios(Callback):
    """After the algorithms ran on AFTER_TRAIN_BATCH: the largest unit grad/weight ratio."""

    def __init__(self) -> None:
        self.ratios: list[float] = []

    def after_train_batch(self, state: State, logger: Any) -> None:
        worst = 0.0
        for p in state.model.parameters():
            ratio = unitwise_norm(p.grad) / unitwise_norm(p.detach()).clamp_min(1e-12)
            worst = max(worst, float(ratio.max()))
        self.ratios.append(worst)


def test_algorithm_clips_every_unit_in_training() -> None:
    ratios = _Ratios()
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=2),
                      max_duration="2ba", algorithms=[GradientClipping("adaptive", 1e-3)],
                      callbacks=[ratios], progress_bar=False, seed=0)
    trainer.fit()
    trainer.close()
    assert len(ratios.ratios) == 2
    assert all(r <= 1e-3 * (1 + 1e-4) for r in ratios.ratios)
    assert not any(math.isnan(r) for r in ratios.ratios)


class _FirstGrads(Callback):
    """The full (gathered) clipped gradients of the first step."""

    def __init__(self) -> None:
        self.grads: dict[str, torch.Tensor] = {}

    def after_train_batch(self, state: State, logger: Any) -> None:
        from tests.algorithms.algorithm_helpers import full

        if not self.grads:
            self.grads = {n: full(p.grad).clone() for n, p in state.model.named_parameters()}


@pytest.fixture(scope="module")
def single_process_adaptive() -> dict[str, torch.Tensor]:
    from tests.algorithms.algorithm_helpers import run_trainer, tiny_gpt

    grads = _FirstGrads()
    run_trainer(tiny_gpt(), [GradientClipping("adaptive", 0.01)], steps=1, callbacks=[grads])
    return grads.grads


@pytest.mark.world_size(2)
def test_fsdp_adaptive_clipping_on_dtensor_shards(
        single_process_adaptive: dict[str, torch.Tensor]) -> None:
    """Under FSDP2 the unit norms are taken on DTensors (rows stay on their rank; a 1-D
    tensor's norm is reduced over the mesh): the clipped gradients equal one process's."""
    from torch.distributed.tensor import DTensor

    from tests.algorithms.algorithm_helpers import run_trainer, tiny_gpt

    grads = _FirstGrads()
    trainer = run_trainer(tiny_gpt(), [GradientClipping("adaptive", 0.01)], steps=1,
                          callbacks=[grads], parallelism_config={"fsdp": {}})
    assert all(isinstance(p.grad, DTensor) for p in trainer.state.model.parameters())
    assert grads.grads.keys() == single_process_adaptive.keys()
    for name, grad in grads.grads.items():
        torch.testing.assert_close(grad, single_process_adaptive[name], rtol=1e-4, atol=1e-7)
