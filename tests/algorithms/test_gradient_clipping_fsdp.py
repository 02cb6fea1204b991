"""GradientClipping: after norm clipping the total gradient norm equals the threshold (when
it was above), in one process and on 2 FSDP2 ranks (DTensor gradients); value clipping
bounds every entry."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from cadence import Callback, State
from cadence.algorithms import GradientClipping, apply_gradient_clipping
from cadence.parallel.grad_norm import get_grad_norm
from tests.algorithms.algorithm_helpers import full, run_trainer, tiny_gpt

THRESHOLD = 0.05  # far below the tiny GPT's gradient norm (about 2-4)


class Norms(Callback):
    """The total gradient norm and the largest |entry| after the algorithms at
    AFTER_TRAIN_BATCH (callbacks run after algorithms on an event)."""

    def __init__(self) -> None:
        self.norms: list[float] = []
        self.max_abs: list[float] = []
        self.first_grads: dict[str, torch.Tensor] = {}

    def after_train_batch(self, state: State, logger: Any) -> None:
        params = list(state.model.parameters())
        self.norms.append(float(get_grad_norm(params)))
        self.max_abs.append(max(float(full(p.grad).abs().max()) for p in params))
        if not self.first_grads:
            self.first_grads = {n: full(p.grad).clone()
                                for n, p in state.model.named_parameters()}


def _backward(model: Any) -> None:
    from tests.algorithms.algorithm_helpers import CountingTokens

    ids = CountingTokens(4).ids
    batch = {"input_ids": ids, "labels": ids}
    model.loss(model(batch), batch).backward()


def test_functional_norm_clipping_hits_the_threshold() -> None:
    model = tiny_gpt()
    _backward(model)
    before = float(get_grad_norm(model.parameters()))
    assert before > THRESHOLD
    returned = apply_gradient_clipping(model.parameters(), "norm", THRESHOLD)
    assert float(returned) == pytest.approx(before, rel=1e-6)
    assert float(get_grad_norm(model.parameters())) == pytest.approx(THRESHOLD, rel=1e-5)
    # below the threshold: unchanged
    grads = [p.grad.clone() for p in model.parameters()]
    apply_gradient_clipping(model.parameters(), "norm", 10.0)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))


def test_trainer_clips_every_step() -> None:
    norms = Norms()
    run_trainer(tiny_gpt(), [GradientClipping("norm", THRESHOLD)], steps=3, callbacks=[norms])
    assert norms.norms == pytest.approx([THRESHOLD] * 3, rel=1e-5)


@pytest.fixture(scope="module")
def single_process_grads() -> dict[str, torch.Tensor]:
    """The clipped gradients of the first step in one process."""
    norms = Norms()
    run_trainer(tiny_gpt(), [GradientClipping("norm", THRESHOLD)], steps=1, callbacks=[norms])
    return norms.first_grads


@pytest.mark.world_size(2)
def test_fsdp_norm_and_value_clipping(single_process_grads: dict[str, torch.Tensor]) -> None:
    norms = Norms()
    trainer = run_trainer(tiny_gpt(), [GradientClipping("norm", THRESHOLD)], steps=3,
                          callbacks=[norms], parallelism_config={"fsdp": {}})
    from torch.distributed.tensor import DTensor

    assert all(isinstance(p.grad, DTensor) for p in trainer.state.model.parameters())
    assert norms.norms == pytest.approx([THRESHOLD] * 3, rel=1e-5)
    assert norms.first_grads.keys() == single_process_grads.keys()
    for name, grad in norms.first_grads.items():  # the same clipped gradients as one process
        torch.testing.assert_close(grad, single_process_grads[name], rtol=1e-4, atol=1e-7)

    values = Norms()
    run_trainer(tiny_gpt(), [GradientClipping("value", 1e-3)], steps=2, callbacks=[values],
                parallelism_config={"fsdp": {}})
    assert max(values.max_abs) == pytest.approx(1e-3)
