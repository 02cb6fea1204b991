"""MixUp (Zhang et al. 2018): the functional mix, and the algorithm in a Trainer."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from cadence.algorithms import MixUp
from cadence.core.callback import Callback
from cadence.functional import mixup_batch
from tests.algorithms.vision_helpers import (
    NUM_CLASSES,
    BatchSpy,
    LossRecorder,
    image_loader,
    loss_fell,
    record_applies,
    run_vision_trainer,
    tiny_classifier,
)


def test_mixup_batch_is_the_convex_mix_with_the_permutation() -> None:
    x = torch.randn(6, 3, 4, 4)
    y = torch.arange(6)
    perm = torch.tensor([5, 4, 3, 2, 1, 0])
    mixed, y_perm, mixing = mixup_batch(x, y, mixing=0.3, indices=perm)
    torch.testing.assert_close(mixed, 0.7 * x + 0.3 * x[perm])
    assert torch.equal(y_perm, y[perm]) and mixing == 0.3


def test_mixup_coefficient_is_at_most_a_half_and_alpha_zero_leaves_input() -> None:
    x, y = torch.randn(8, 3), torch.arange(8)
    draws = [mixup_batch(x, y, alpha=1.0)[2] for _ in range(200)]
    assert all(0.0 <= m <= 0.5 for m in draws) and max(draws) > 0.3
    mixed, _, mixing = mixup_batch(x, y, alpha=0.0)
    assert mixing == 0.0 and torch.equal(mixed, x)


@pytest.mark.parametrize("kwargs, match", [
    ({"mixing": 1.5}, "mixing must be in"),
    ({"alpha": -1.0}, "alpha must be >= 0"),
    ({"indices": torch.arange(3)}, r"indices must have shape \(4,\)"),
])
def test_mixup_batch_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        mixup_batch(torch.randn(4, 2), torch.arange(4), **kwargs)


def test_constructor_rejects_negative_alpha() -> None:
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        MixUp(alpha=-0.1)


def test_trainer_mixes_inputs_and_dense_targets_that_sum_to_one() -> None:
    algorithm = MixUp(alpha=1.0)
    events = record_applies(algorithm)
    spy = BatchSpy("before_loss", "after_loss")
    loader = image_loader(batch_size=8, num_samples=16)
    originals = [(x.clone(), y.clone()) for x, y in loader]
    run_vision_trainer(tiny_classifier(), [algorithm], steps=2, train_dataloader=loader,
                       callbacks=[spy])
    assert [e.value for e in events] == ["before_forward", "before_loss", "after_loss"] * 2
    (x_mixed, y_mixed), (x0, y0) = spy.seen["before_loss"][-1], originals[-1]
    m, perm = algorithm.mixing, algorithm.indices
    torch.testing.assert_close(x_mixed, (1 - m) * x0 + m * x0[perm])
    assert y_mixed.shape == (8, NUM_CLASSES)
    torch.testing.assert_close(y_mixed.sum(dim=1), torch.ones(8))
    expected = (1 - m) * F.one_hot(y0, NUM_CLASSES) + m * F.one_hot(y0[perm], NUM_CLASSES)
    torch.testing.assert_close(y_mixed, expected.float())
    # the labels are back (class indices) for the train metrics after the loss
    assert torch.equal(spy.seen["after_loss"][-1][1], y0)


class _LossCheck(Callback):
    """At AFTER_LOSS: the expected interpolated loss from the outputs and the algorithm."""

    def __init__(self, algorithm: MixUp, share: float) -> None:
        self.algorithm, self.share, self.pairs = algorithm, share, []

    def after_loss(self, state: Any, logger: Any) -> None:
        outputs, target = state.outputs.detach(), state.batch[1]
        m = self.algorithm.mixing
        expected = self.share * ((1 - m) * F.cross_entropy(outputs, target)
                                 + m * F.cross_entropy(outputs, self.algorithm.permuted_target))
        self.pairs.append((float(state.loss.detach()), float(expected)))


def test_interpolate_loss_mixes_losses_with_the_microbatch_weight() -> None:
    algorithm = MixUp(alpha=1.0, interpolate_loss=True)
    check = _LossCheck(algorithm, share=0.5)
    run_vision_trainer(tiny_classifier(), [algorithm], steps=2, callbacks=[check],
                       train_dataloader=image_loader(batch_size=8, num_samples=16),
                       device_train_microbatch_size=4)
    assert len(check.pairs) == 4
    for got, expected in check.pairs:
        assert got == pytest.approx(expected, rel=1e-5)


def test_loss_falls_with_mixup() -> None:
    recorder = LossRecorder()
    run_vision_trainer(tiny_classifier(), [MixUp(alpha=0.2)], steps=12, callbacks=[recorder],
                       train_dataloader=image_loader(batch_size=8, num_samples=96))
    assert loss_fell(recorder.losses)
