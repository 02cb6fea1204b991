"""Composer's segmentation and binary metrics and losses: MIoU, Dice, BinaryF1Score, DiceLoss,
binary_cross_entropy_with_logits, checked against hand counts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cadence.loss import DiceLoss, binary_cross_entropy_with_logits, ensure_targets_one_hot
from cadence.metrics import BinaryF1Score, Dice, MIoU


def _logits_for(predictions: torch.Tensor, classes: int) -> torch.Tensor:
    """Scores ``[N, C, ...]`` whose argmax over dim 1 is ``predictions``."""
    return F.one_hot(predictions, classes).movedim(-1, 1).float()


def test_miou_counts_intersection_over_union_per_class_and_skips_ignored_pixels() -> None:
    predictions = torch.tensor([[[0, 1], [1, 2]]])
    targets = torch.tensor([[[0, 1], [2, -1]]])  # the last pixel is ignored
    metric = MIoU(num_classes=3)
    metric.update(_logits_for(predictions, 3), targets)
    # class 0: 1/1; class 1: pred {01, 10}, target {01} -> 1/2; class 2: pred {} (ignored
    # pixel dropped), target {10} -> 0/1
    assert metric.compute().item() == pytest.approx(100 * (1 + 0.5 + 0) / 3)


def test_miou_rejects_a_bad_class_count() -> None:
    with pytest.raises(ValueError, match="num_classes"):
        MIoU(num_classes=0)


def test_dice_scores_foreground_classes_and_averages_over_updates() -> None:
    targets = torch.tensor([[1, 1, 2, 0]])
    predictions = torch.tensor([[1, 0, 2, 2]])
    metric = Dice(num_classes=2)
    metric.update(_logits_for(predictions, 3), targets)
    # class 1: TP 1, FP 0, FN 1 -> 2/3; class 2: TP 1, FP 1, FN 0 -> 2/3
    assert metric.compute() == pytest.approx(round(100 * 2 / 3, 2))
    metric.update(_logits_for(targets, 3), targets)  # a perfect second update
    assert metric.compute() == pytest.approx(round(100 * (2 / 3 + 1) / 2, 2))
    with pytest.raises(ValueError, match="3 score channels"):
        metric.update(torch.zeros(1, 2, 4), targets)


def test_binary_f1_matches_its_definition() -> None:
    scores = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])  # predicts 1,0,1,1
    targets = torch.tensor([1, 1, 0, 1])
    metric = BinaryF1Score()
    metric.update(scores, targets)
    tp, fp, fn = 2, 1, 1
    assert metric.compute().item() == pytest.approx(2 * tp / (2 * tp + fp + fn))
    with pytest.raises(ValueError, match="undefined"):
        empty = BinaryF1Score()
        empty.update(torch.tensor([[1.0, 0.0]]), torch.tensor([0]))
        empty.compute()


def test_dice_loss_is_zero_for_a_perfect_prediction_and_near_one_for_the_opposite() -> None:
    targets = torch.tensor([[[0, 1], [1, 0]]])
    perfect = _logits_for(targets, 2)
    assert DiceLoss()(perfect, targets).item() == pytest.approx(0.0, abs=1e-5)
    assert DiceLoss()(1 - perfect, targets).item() == pytest.approx(1.0, abs=1e-4)
    # Jaccard = Dice / (2 - Dice) per class: with soft input 0.5 everywhere
    half = torch.full((1, 2, 2, 2), 0.5)
    dice = 1 - DiceLoss(reduction="none")(half, targets)
    jaccard = 1 - DiceLoss(jaccard=True, reduction="none")(half, targets)
    assert torch.allclose(jaccard, dice / (2 - dice), atol=1e-4)


def test_dice_loss_ignores_pixels_without_a_target_and_rejects_both_activations() -> None:
    targets = torch.tensor([[[0, -100]]])  # the second pixel has no target
    scores = torch.tensor([[[[1.0, 1.0]], [[0.0, 0.0]]]])  # [1, 2, 1, 2]: class 0 everywhere
    assert DiceLoss(reduction="none")(scores, targets)[0, 0].item() == pytest.approx(0.0, abs=1e-5)
    with pytest.raises(ValueError, match="not both"):
        DiceLoss(sigmoid=True, softmax=True)
    with pytest.raises(ValueError, match="reduction"):
        DiceLoss(reduction="avg")


def test_binary_cross_entropy_takes_indices_and_scales_by_batch_size() -> None:
    logits = torch.randn(4, 3)
    indices = torch.tensor([0, 2, 1, 2])
    dense = ensure_targets_one_hot(logits, indices)
    expected = F.binary_cross_entropy_with_logits(logits, dense, reduction="sum") / 4
    assert torch.allclose(binary_cross_entropy_with_logits(logits, indices), expected)
    unscaled = binary_cross_entropy_with_logits(logits, dense, scale_by_batch_size=False)
    assert torch.allclose(unscaled, expected * 4)
    with pytest.raises(ValueError, match="reduction"):
        binary_cross_entropy_with_logits(logits, indices, reduction="avg")


def test_initializers_touch_only_their_layers() -> None:
    from torch import nn

    from cadence.models import Initializer

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 10))
    with torch.no_grad():
        model[1].weight.fill_(3.0)
    conv_before = model[0].weight.clone()
    model.apply(Initializer("kaiming_normal").get_initializer())
    assert not torch.equal(model[0].weight, conv_before)
    assert torch.all(model[1].weight == 3.0)  # BatchNorm left alone
    model.apply(Initializer.BN_ONES.get_initializer())
    assert torch.all(model[1].weight == 1.0) and torch.all(model[1].bias == 0.0)
    model.apply(Initializer.LINEAR_LOG_CONSTANT_BIAS.get_initializer())
    assert torch.allclose(model[3].bias, torch.full((10,), -torch.log(torch.tensor(10.0)).item()))
    with pytest.raises(ValueError):
        Initializer("he_normal")
