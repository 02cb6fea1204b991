"""CutMix (Yun et al. 2019): the functional box paste, and the algorithm in a Trainer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cadence.algorithms import CutMix
from cadence.functional import cutmix_batch
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


def _distinct_images(n: int = 4, h: int = 12, w: int = 10) -> torch.Tensor:
    """Images whose every pixel value says which image it came from (value = index + 1)."""
    return (torch.arange(n, dtype=torch.float32) + 1).view(n, 1, 1, 1).expand(n, 3, h, w).clone()


def test_box_comes_from_the_partner_and_area_is_the_kept_fraction() -> None:
    x = _distinct_images()
    perm = torch.tensor([1, 2, 3, 0])
    for seed in range(20):
        np.random.seed(seed)
        mixed, y_perm, area, (r1, c1, r2, c2) = cutmix_batch(x, torch.arange(4), indices=perm)
        from_partner = mixed != x  # every pixel that changed came from the partner
        assert torch.equal(mixed[from_partner], x[perm][from_partner])
        inside = torch.zeros(12, 10, dtype=torch.bool)
        inside[r1:r2, c1:c2] = True
        assert torch.equal(from_partner[:, 0], inside.expand(4, 12, 10))
        assert area == pytest.approx(1 - from_partner[0, 0].float().mean().item())
        assert torch.equal(y_perm, perm)


def test_given_bbox_and_length_set_the_box() -> None:
    x = _distinct_images(h=16, w=16)
    mixed, _, area, bbox = cutmix_batch(x, torch.arange(4), bbox=(2, 4, 6, 12))
    assert bbox == (2, 4, 6, 12) and area == pytest.approx(1 - 4 * 8 / 256)
    np.random.seed(0)
    for _ in range(10):  # length=0.5: an 8x8 box before clipping at the border
        _, _, area, (r1, c1, r2, c2) = cutmix_batch(x, torch.arange(4), length=0.5)
        assert r2 - r1 <= 8 and c2 - c1 <= 8
        assert area == pytest.approx(1 - (r2 - r1) * (c2 - c1) / 256)
    with pytest.raises(ValueError, match="give length or bbox, not both"):
        cutmix_batch(x, torch.arange(4), length=0.5, bbox=(0, 0, 1, 1))
    with pytest.raises(ValueError, match="length must be in"):
        cutmix_batch(x, torch.arange(4), length=1.5)


def test_area_follows_lambda_on_average() -> None:
    """With alpha = 1 (lambda uniform) the kept area averages about 1/2 (clipping adds a
    little) and spans most of [0, 1]."""
    np.random.seed(0)
    x = torch.zeros(2, 1, 32, 32)
    areas = [cutmix_batch(x, torch.arange(2), alpha=1.0)[2] for _ in range(400)]
    assert 0.5 < float(np.mean(areas)) < 0.75 and min(areas) < 0.2 and max(areas) > 0.95


def test_trainer_targets_are_mixed_by_area_and_sum_to_one() -> None:
    algorithm = CutMix(alpha=1.0)
    events = record_applies(algorithm)
    spy = BatchSpy("before_loss", "after_loss")
    loader = image_loader(batch_size=8, num_samples=8)
    x0, y0 = next(iter(loader))
    run_vision_trainer(tiny_classifier(), [algorithm], steps=1, train_dataloader=loader,
                       callbacks=[spy])
    assert [e.value for e in events] == ["before_forward", "before_loss", "after_loss"]
    x_mixed, y_mixed = spy.seen["before_loss"][0]
    r1, c1, r2, c2 = algorithm._bbox
    perm = algorithm._indices
    torch.testing.assert_close(x_mixed[..., r1:r2, c1:c2], x0[perm][..., r1:r2, c1:c2])
    area = algorithm._adjusted_lambda
    expected = area * F.one_hot(y0, NUM_CLASSES) + (1 - area) * F.one_hot(y0[perm], NUM_CLASSES)
    torch.testing.assert_close(y_mixed, expected.float())
    torch.testing.assert_close(y_mixed.sum(dim=1), torch.ones(8))
    assert torch.equal(spy.seen["after_loss"][0][1], y0)  # labels back for the metrics


def test_segmentation_targets_get_the_same_box() -> None:
    from cadence.core import Event

    algorithm = CutMix(alpha=1.0)
    x = torch.randn(4, 3, 8, 8)
    y = torch.arange(4).view(4, 1, 1).expand(4, 8, 8).clone()

    class _State:
        batch = [x, y]
        outputs = torch.randn(4, 5, 8, 8)

    state = _State()
    np.random.seed(3)
    algorithm.apply(Event.BEFORE_FORWARD, state, None)
    algorithm.apply(Event.BEFORE_LOSS, state, None)
    r1, c1, r2, c2 = algorithm._bbox
    target = state.batch[1]
    assert torch.equal(target[:, r1:r2, c1:c2], y[algorithm._indices][:, r1:r2, c1:c2])
    outside = torch.ones(8, 8, dtype=torch.bool)
    outside[r1:r2, c1:c2] = False
    assert torch.equal(target[:, outside], y[:, outside])


def test_loss_falls_with_cutmix() -> None:
    recorder = LossRecorder()
    run_vision_trainer(tiny_classifier(), [CutMix(alpha=1.0)], steps=12, callbacks=[recorder],
                       train_dataloader=image_loader(batch_size=8, num_samples=96))
    assert loss_fell(recorder.losses)


def test_constructor_rejects_negative_alpha() -> None:
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        CutMix(alpha=-1)


def test_composers_rand_bbox_signature_gives_the_box_cutmix_batch_pastes() -> None:
    """Composer's tests call the private ``_rand_bbox(W=, H=, cutmix_lambda=, cx=, cy=,
    uniform_sampling=)``; ``W`` runs along dim -2, and the box is what cutmix_batch pastes."""
    from cadence.algorithms.cutmix.cutmix import _rand_bbox

    # lambda 0.75: sides scaled by sqrt(0.25) = 0.5 -> cut 4 along W=8, 3 along H=6
    assert _rand_bbox(W=8, H=6, cutmix_lambda=0.75, cx=4, cy=3) == (2, 2, 6, 4)
    assert _rand_bbox(W=8, H=6, cutmix_lambda=0.75, cx=0, cy=5,
                      uniform_sampling=True) == (0, 4, 2, 6)  # clipped at the borders
    x = torch.arange(2 * 8 * 6, dtype=torch.float32).reshape(2, 1, 8, 6)
    mixed, _, area, bbox = cutmix_batch(x, torch.tensor([0, 1]), bbox=(2, 2, 6, 4),
                                        indices=torch.tensor([1, 0]))
    assert bbox == (2, 2, 6, 4) and area == pytest.approx(1 - 8 / 48)
    assert torch.equal(mixed[0, :, 2:6, 2:4], x[1, :, 2:6, 2:4])
    mixed[0, :, 2:6, 2:4] = x[0, :, 2:6, 2:4]
    assert torch.equal(mixed[0], x[0])
