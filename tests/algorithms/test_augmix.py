"""AugMix (Hendrycks et al. 2020): the mix of augmentation chains on PIL images and tensors,
and the algorithm adding its transform to the train dataset."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cadence.algorithms import AugmentAndMixTransform, AugMix
from cadence.functional import augmix_image
from cadence.algorithms.utils.augmentation_primitives import augmentation_sets, autocontrast, rotate
from tests.algorithms.vision_helpers import (
    assert_dataset_transform_added_and_loss_falls,
    random_pil_image,
)


def _image(mode: str = "RGB") -> object:
    return random_pil_image(mode, seed=1)


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("augmentation_set", sorted(augmentation_sets))
def test_keeps_size_and_mode(mode: str, augmentation_set: str) -> None:
    np.random.seed(0)
    image = _image(mode)
    out = AugmentAndMixTransform(severity=5, width=2, augmentation_set=augmentation_set)(image)
    assert out.size == image.size and out.mode == mode


def test_severity_zero_with_identity_ops_returns_the_image() -> None:
    np.random.seed(0)
    image = _image()
    out = augmix_image(image, severity=0, depth=2, width=3, augmentation_set=[rotate])
    assert np.array_equal(np.asarray(out), np.asarray(image))  # a convex mix of copies


def test_result_lies_between_the_image_and_its_augmentation() -> None:
    """With one deterministic op (autocontrast) every pixel of the mix lies between the
    original and the augmented value (a convex combination), rounded."""
    np.random.seed(0)
    image = _image()
    augmented = np.asarray(autocontrast(image), dtype=np.int16)
    original = np.asarray(image, dtype=np.int16)
    for _ in range(5):
        out = np.asarray(augmix_image(image, severity=3, depth=1, width=2,
                                      augmentation_set=[autocontrast]), dtype=np.int16)
        low, high = np.minimum(original, augmented), np.maximum(original, augmented)
        assert np.all(out >= low) and np.all(out <= high)


def test_tensor_batch_keeps_shape() -> None:
    np.random.seed(0)
    batch = torch.rand(2, 3, 12, 10)
    out = augmix_image(batch)
    assert out.shape == batch.shape and float(out.min()) >= 0 and float(out.max()) <= 1


@pytest.mark.parametrize("kwargs, error, match", [
    ({"severity": -1}, ValueError, "severity must be an integer in"),
    ({"width": 0}, ValueError, "width must be an integer >= 1"),
    ({"alpha": 0.0}, ValueError, "alpha must be > 0"),
    ({"augmentation_set": "none"}, KeyError, "augmentation_set='none'"),
])
def test_bad_arguments(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        AugMix(**kwargs)
    with pytest.raises(error, match=match):
        AugmentAndMixTransform(**kwargs)


def test_trainer_adds_transform_before_to_tensor_and_loss_falls() -> None:
    assert_dataset_transform_added_and_loss_falls(AugMix(severity=3, width=2), AugmentAndMixTransform)
