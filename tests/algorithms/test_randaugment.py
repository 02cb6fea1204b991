"""RandAugment (Cubuk et al. 2020): the functional chain on PIL images and tensors, and the
algorithm adding its transform to the train dataset."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cadence.algorithms import RandAugment, RandAugmentTransform
from cadence.functional import randaugment_image
from cadence.algorithms.utils.augmentation_primitives import augmentation_sets, rotate, solarize
from tests.algorithms.vision_helpers import (
    PILBrightestChannel,
    ToTensor,
    assert_dataset_transform_added_and_loss_falls,
    random_pil_image,
)


def _image(mode: str = "RGB", size: tuple[int, int] = (20, 14)) -> object:
    return random_pil_image(mode, size, seed=0)


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("augmentation_set", sorted(augmentation_sets))
def test_keeps_size_and_mode(mode: str, augmentation_set: str) -> None:
    np.random.seed(0)
    image = _image(mode)
    transform = RandAugmentTransform(severity=9, depth=3, augmentation_set=augmentation_set)
    for _ in range(5):
        out = transform(image)
        assert out.size == image.size and out.mode == mode


def test_tensor_and_batch_inputs_keep_their_shape() -> None:
    np.random.seed(0)
    batch = torch.rand(3, 3, 12, 10)
    out = randaugment_image(batch, severity=5, depth=2)
    assert out.shape == batch.shape and out.dtype == torch.float32
    assert not torch.equal(out, batch)
    assert randaugment_image(batch[0]).shape == (3, 12, 10)


def test_severity_zero_with_identity_ops_and_depth_zero_change_nothing() -> None:
    image = _image()
    same = randaugment_image(image, severity=0, depth=4, augmentation_set=[rotate, solarize])
    assert np.array_equal(np.asarray(same), np.asarray(image))
    assert np.array_equal(np.asarray(randaugment_image(image, severity=9, depth=0)),
                          np.asarray(image))


@pytest.mark.parametrize("kwargs, error, match", [
    ({"severity": 11}, ValueError, "severity must be an integer in"),
    ({"depth": -1}, ValueError, "depth must be an integer >= 0"),
    ({"augmentation_set": "most"}, KeyError, "augmentation_set='most'"),
])
def test_bad_arguments(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        RandAugment(**kwargs)
    with pytest.raises(error, match=match):
        RandAugmentTransform(**kwargs)


def test_trainer_adds_transform_before_to_tensor_and_loss_falls() -> None:
    assert_dataset_transform_added_and_loss_falls(RandAugment(severity=3, depth=1), RandAugmentTransform)


def test_plain_callable_transform_is_composed_and_missing_transform_refused() -> None:
    from torch.utils.data import DataLoader, TensorDataset

    from cadence.core.event import Event
    from cadence.utils.misc import add_vision_dataset_transform

    dataset = PILBrightestChannel(4)
    dataset.transform = ToTensor()
    add_vision_dataset_transform(dataset, RandAugmentTransform(severity=2))
    assert dataset[0][0].shape == (3, 16, 16)  # PIL transform first, then the callable

    class _State:
        dataloader = DataLoader(TensorDataset(torch.zeros(4, 3, 8, 8)))
        train_dataloader = None

    with pytest.raises(TypeError, match="TensorDataset has no 'transform' attribute"):
        RandAugment().apply(Event.FIT_START, _State(), None)
