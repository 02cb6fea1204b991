"""RandAugment: a chain of ``depth`` augmentations drawn at random, at one severity.

Source: Cubuk et al., "RandAugment: Practical automated data augmentation with a reduced
search space", NeurIPS 2020 (``depth`` is the paper's N, ``severity`` its M); MosaicML
Composer's ``RandAugment`` / ``RandAugmentTransform`` / ``randaugment_image``
(``composer/algorithms/randaugment/randaugment.py``): same arguments, defaults, sets and
event (``FIT_START``, adding the transform to the train dataset). The augmentations are
:mod:`cadence.algorithms.utils.augmentation_primitives` (Pillow); no torchvision is needed.
"""

from __future__ import annotations

import weakref
from typing import Any, Optional, TypeVar

import numpy as np
import torch

from cadence.registry import algorithms
from cadence.core import Algorithm, Event, State
from cadence.utils.misc import add_vision_dataset_transform

__all__ = ["RandAugment", "RandAugmentTransform", "randaugment_image"]

ImgT = TypeVar("ImgT")


def randaugment_image(img: ImgT, severity: int = 9, depth: int = 2,
                      augmentation_set: Optional[list] = None) -> ImgT:
    """Apply ``depth`` augmentations, each drawn uniformly (with replacement) from
    ``augmentation_set``, at intensity ``severity``, to an image or each image of a batch.

    Args:
        img: a ``PIL`` image, a tensor ``[C, H, W]`` (float in ``[0, 1]`` or ``uint8``) or a
            batch ``[N, C, H, W]``; ``C`` in 1, 3, 4.
        severity: intensity in ``[0, 10]``; default 9.
        depth: augmentations per image, ``>= 0``; default 2.
        augmentation_set: the augmentations, ``fn(pil_img, level)``; default
            ``augmentation_sets['all']``.

    Returns:
        The same type, size and mode (tensors come back float in ``[0, 1]``, quantized to
        8 bits by the trip through ``PIL``).
    """
    from cadence.algorithms.utils.augmentation_common import map_pillow_function
    from cadence.algorithms.utils.augmentation_primitives import augmentation_sets

    augmentations = augmentation_sets["all"] if augmentation_set is None else augmentation_set

    def chain(pil_img: Any) -> Any:
        for _ in range(depth):
            pil_img = augmentations[np.random.randint(len(augmentations))](pil_img, severity)
        return pil_img

    return map_pillow_function(chain, img)


def _check_depth(depth: Any, owner: str) -> int:
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise ValueError(f"{owner}: depth must be an integer >= 0, got {depth!r}.")
    return depth


class RandAugmentTransform(torch.nn.Module):
    """:func:`randaugment_image` as a dataset transform (a ``torch.nn.Module``, as Composer).

    Args:
        severity: intensity in ``[0, 10]``; default 9.
        depth: augmentations per image; default 2.
        augmentation_set: ``'all'`` (default), ``'safe'`` or ``'original'`` (see
            :data:`~cadence.algorithms.utils.augmentation_primitives.augmentation_sets`).

    Raises:
        ValueError: ``severity`` outside ``[0, 10]`` or a negative ``depth``.
        KeyError: an unknown ``augmentation_set``.
    """

    def __init__(self, severity: int = 9, depth: int = 2, augmentation_set: str = "all") -> None:
        super().__init__()
        from cadence.algorithms.utils.augmentation_primitives import (
        check_augmentation_set, check_severity,
    )

        self.severity = check_severity(severity, "RandAugmentTransform")
        self.depth = _check_depth(depth, "RandAugmentTransform")
        self.augmentation_set = check_augmentation_set(augmentation_set, "RandAugmentTransform")

    def forward(self, img: ImgT) -> ImgT:
        return randaugment_image(img, self.severity, self.depth, self.augmentation_set)


@algorithms.register("randaugment")
class RandAugment(Algorithm):
    """RandAugment (Cubuk et al. 2020) in the train dataset's pipeline.

    At ``FIT_START`` a :class:`RandAugmentTransform` is added to the train dataloader's
    dataset's ``transform`` (once per dataset), before its ``ToTensor`` step if it has one
    (:func:`~cadence.utils.misc.add_vision_dataset_transform`), so each sample image (a
    ``PIL`` image or a ``[C, H, W]`` tensor) gets ``depth`` random augmentations of
    intensity ``severity``; its size and mode are kept.

    Args:
        severity: intensity in ``[0, 10]`` (the paper's M); default 9.
        depth: augmentations per image (the paper's N); default 2.
        augmentation_set: ``'all'`` (default), ``'safe'`` (without the ImageNet-C
            corruptions) or ``'original'`` (the AugMix reference's enhancement factors).

    Raises:
        ValueError: ``severity`` outside ``[0, 10]`` or a negative ``depth``.
        KeyError: an unknown ``augmentation_set``.
        TypeError: (at ``FIT_START``) the train dataloader is not a torch ``DataLoader``, or
            its dataset has no ``transform`` attribute (datasets that transform their
            samples some other way are refused: add :class:`RandAugmentTransform` to them
            yourself).

    Example (YAML)::

        algorithms:
          randaugment: {severity: 9, depth: 2}
    """

    events = frozenset({Event.FIT_START})

    def __init__(self, severity: int = 9, depth: int = 2, augmentation_set: str = "all") -> None:
        from cadence.algorithms.utils.augmentation_primitives import (
        check_augmentation_set, check_severity,
    )

        self.severity = check_severity(severity, "RandAugment")
        self.depth = _check_depth(depth, "RandAugment")
        check_augmentation_set(augmentation_set, "RandAugment")
        self.augmentation_set = augmentation_set
        self._transformed_datasets: weakref.WeakSet = weakref.WeakSet()

    def match(self, event: Event, state: State) -> bool:
        from cadence.algorithms.colout.colout import train_dataset

        return event == Event.FIT_START and \
            train_dataset(state, self) not in self._transformed_datasets

    def apply(self, event: Event, state: State, logger: Any) -> None:
        from cadence.algorithms.colout.colout import train_dataset

        dataset = train_dataset(state, self)
        add_vision_dataset_transform(
            dataset, RandAugmentTransform(self.severity, self.depth, self.augmentation_set),
            is_tensor_transform=False)
        self._transformed_datasets.add(dataset)
