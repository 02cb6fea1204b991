"""The PIL augmentations shared by RandAugment and AugMix, the PIL <-> tensor bridge, and
add_vision_dataset_transform."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("PIL")

import PIL.Image  # noqa: E402

from cadence.utils import add_vision_dataset_transform  # noqa: E402
from cadence.algorithms.utils import augmentation_common as common  # noqa: E402
from cadence.algorithms.utils import augmentation_primitives as ap  # noqa: E402

ALL_OPS = sorted({op for ops in ap.augmentation_sets.values() for op in ops},
                 key=lambda op: op.__name__)
#: the ops that leave an image unchanged at level 0
IDENTITY_AT_ZERO = [ap.rotate, ap.solarize, ap.shear_x, ap.shear_y, ap.translate_x,
                    ap.translate_y, ap.color, ap.contrast, ap.brightness, ap.sharpness]


def _image(mode: str = "RGB", width: int = 24, height: int = 18) -> PIL.Image.Image:
    rng = np.random.default_rng(0)
    shape = (height, width, 3) if mode == "RGB" else (height, width)
    return PIL.Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8))


@pytest.mark.parametrize("op", ALL_OPS, ids=lambda op: op.__name__)
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_every_op_keeps_size_and_mode_at_every_level(op: Any, mode: str) -> None:
    np.random.seed(0)
    image = _image(mode)
    for level in (0, 1, 5, 10):
        out = op(image, level)
        assert out.size == image.size and out.mode == mode


@pytest.mark.parametrize("op", IDENTITY_AT_ZERO, ids=lambda op: op.__name__)
def test_level_zero_is_the_identity(op: Any) -> None:
    np.random.seed(0)
    image = _image()
    for _ in range(5):
        assert np.array_equal(np.asarray(op(image, 0)), np.asarray(image))


def test_strong_levels_change_images() -> None:
    np.random.seed(0)
    image = np.asarray(_image())
    for op in (ap.rotate, ap.solarize, ap.translate_x, ap.shear_y, ap.contrast):
        assert not np.array_equal(np.asarray(op(_image(), 10)), image), op.__name__


def test_posterize_keeps_at_most_four_bits() -> None:
    np.random.seed(0)
    for level in (0, 10):
        values = np.asarray(ap.posterize(_image(), level))
        assert np.all(values % 16 == 0)


def test_augmentation_sets() -> None:
    sets = ap.augmentation_sets
    assert sorted(sets) == ["all", "original", "safe"]
    assert len(sets["all"]) == len(sets["original"]) == 13 and len(sets["safe"]) == 9
    assert ap.color not in sets["safe"] and ap.color_original in sets["original"]
    with pytest.raises(KeyError, match="augmentation_set='x' is not one of"):
        ap.check_augmentation_set("x", "Test")


def test_image_as_type_round_trip_is_exact_on_8_bit_values() -> None:
    tensor = torch.randint(0, 256, (3, 5, 7)).float() / 255
    image = common.image_as_type(tensor, PIL.Image.Image)
    assert image.mode == "RGB" and image.size == (7, 5)
    assert torch.equal(common.image_as_type(image, torch.Tensor), tensor)
    gray = common.image_as_type(torch.rand(5, 7), PIL.Image.Image)
    assert gray.mode == "L" and common.image_as_type(gray, torch.Tensor).shape == (1, 5, 7)
    with pytest.raises(ValueError, match="C in 1, 3, 4"):
        common.image_as_type(torch.rand(2, 5, 7), PIL.Image.Image)
    with pytest.raises(TypeError, match="typ must be"):
        common.image_as_type(tensor, np.ndarray)


def test_map_pillow_function_keeps_layout() -> None:
    flip = lambda image: image.transpose(PIL.Image.Transpose.FLIP_LEFT_RIGHT)  # noqa: E731
    batch = torch.randint(0, 256, (2, 3, 4, 6)).float() / 255
    assert torch.equal(common.map_pillow_function(flip, batch), batch.flip(-1))
    assert torch.equal(common.map_pillow_function(flip, batch[0]), batch[0].flip(-1))
    out = common.map_pillow_function(flip, _image())
    assert isinstance(out, PIL.Image.Image)


class _ToTensor:
    def __call__(self, image: Any) -> Any:
        return image


_ToTensor.__name__ = "ToTensor"


class _Compose:
    def __init__(self, transforms: list) -> None:
        self.transforms = transforms


class _Dataset:
    def __init__(self, transform: Any) -> None:
        self.transform = transform


def test_add_vision_dataset_transform_placement() -> None:
    def aug(image: Any) -> Any:
        return image

    def tensor_aug(image: Any) -> Any:
        return image

    to_tensor, other = _ToTensor(), (lambda image: image)
    dataset = _Dataset(_Compose([other, to_tensor]))
    add_vision_dataset_transform(dataset, aug)
    add_vision_dataset_transform(dataset, tensor_aug, is_tensor_transform=True)
    assert dataset.transform.transforms == [other, aug, to_tensor, tensor_aug]
    listed = _Dataset([other])
    add_vision_dataset_transform(listed, aug)
    assert listed.transform == [other, aug]  # no ToTensor: appended
    empty = _Dataset(None)
    add_vision_dataset_transform(empty, aug)
    assert empty.transform is aug


def test_add_vision_dataset_transform_composes_a_plain_callable() -> None:
    calls: list[str] = []
    dataset = _Dataset(lambda image: calls.append("old") or image)
    add_vision_dataset_transform(dataset, lambda image: calls.append("new") or image)
    dataset.transform(0)
    assert calls == ["new", "old"]


def test_add_vision_dataset_transform_refusals() -> None:
    with pytest.raises(TypeError, match="object has no 'transform' attribute"):
        add_vision_dataset_transform(object(), lambda image: image)
    with pytest.raises(TypeError, match="transform is a int"):
        add_vision_dataset_transform(_Dataset(3), lambda image: image)
