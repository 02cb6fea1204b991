"""AugMix: a convex mix of the image with several random augmentation chains.

Source: Hendrycks et al., "AugMix: A Simple Data Processing Method to Improve Robustness and
Uncertainty", ICLR 2020; MosaicML Composer's ``AugMix`` / ``AugmentAndMixTransform`` /
``augmix_image`` (``composer/algorithms/augmix/augmix.py``): same arguments, defaults, sets,
draws and event (``FIT_START``, adding the transform to the train dataset). The paper's
Jensen-Shannon consistency loss is not part of it (as in Composer). Differences: the mix is
rounded to the nearest 8-bit value (Composer truncates, darkening every image by half a
level on average), and ``alpha`` must be > 0 (the Dirichlet and Beta draws need it).
"""

from __future__ import annotations

import weakref
from typing import Any, Optional, TypeVar

import numpy as np
import torch

from cadence.registry import algorithms
from cadence.core import Algorithm, Event, State
from cadence.utils.misc import add_vision_dataset_transform

__all__ = ["AugMix", "AugmentAndMixTransform", "augmix_image"]

ImgT = TypeVar("ImgT")


def augmix_image(img: ImgT, severity: int = 3, depth: int = -1, width: int = 3,
                 alpha: float = 1.0, augmentation_set: Optional[list] = None) -> ImgT:
    """AugMix one image or each image of a batch.

    ``width`` chains are built, each of ``depth`` augmentations (drawn uniformly from
    ``augmentation_set``; ``depth <= 0``: a depth drawn uniformly from 1 to 3 per chain) at
    intensity ``severity``. The chains are averaged with weights ``w ~ Dirichlet(alpha, ...,
    alpha)``, and the result is ``(1 - m) * image + m * sum_i w_i chain_i`` with
    ``m ~ Beta(alpha, alpha)``, rounded to 8 bits.

    Args:
        img: a ``PIL`` image, a tensor ``[C, H, W]`` (float in ``[0, 1]`` or ``uint8``) or a
            batch ``[N, C, H, W]``; ``C`` in 1, 3, 4.
        severity: intensity in ``[0, 10]``; default 3.
        depth: augmentations per chain; ``-1`` (default): 1 to 3 at random.
        width: the number of chains, ``>= 1``; default 3.
        alpha: the Dirichlet and Beta parameter, ``> 0``; default 1.
        augmentation_set: the augmentations; default ``augmentation_sets['all']``.

    Returns:
        The same type, size and mode.
    """
    from cadence.algorithms.utils.augmentation_common import map_pillow_function
    from cadence.algorithms.utils.augmentation_primitives import augmentation_sets

    augmentations = augmentation_sets["all"] if augmentation_set is None else augmentation_set

    def mix(pil_img: Any) -> Any:
        import PIL.Image

        weights = np.random.dirichlet([alpha] * width).astype(np.float32)
        m = np.float32(np.random.beta(alpha, alpha))
        original = np.asarray(pil_img, dtype=np.float32)
        combined = np.zeros_like(original)
        for chain_weight in weights:
            chain = pil_img.copy()
            for _ in range(depth if depth > 0 else np.random.randint(1, 4)):
                chain = augmentations[np.random.randint(len(augmentations))](chain, severity)
            combined += chain_weight * np.asarray(chain, dtype=np.float32)
        mixed = (1 - m) * original + m * combined
        out = PIL.Image.fromarray(np.clip(np.rint(mixed), 0, 255).astype(np.uint8))
        return out if out.mode == pil_img.mode else out.convert(pil_img.mode)

    return map_pillow_function(mix, img)


def _check_args(severity: Any, depth: Any, width: Any, alpha: Any, augmentation_set: str,
                owner: str) -> int:
    from cadence.algorithms.utils.augmentation_primitives import (
        check_augmentation_set, check_severity,
    )

    check_augmentation_set(augmentation_set, owner)
    if isinstance(depth, bool) or not isinstance(depth, int):
        raise ValueError(f"{owner}: depth must be an integer (-1: 1 to 3 at random), got "
                         f"{depth!r}.")
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"{owner}: width must be an integer >= 1, got {width!r}.")
    if not alpha > 0:
        raise ValueError(f"{owner}: alpha must be > 0, got {alpha!r}.")
    return check_severity(severity, owner)


class AugmentAndMixTransform(torch.nn.Module):
    """:func:`augmix_image` as a dataset transform (a ``torch.nn.Module``, as Composer).

    Args:
        severity: intensity in ``[0, 10]``; default 3.
        depth: augmentations per chain; default -1 (1 to 3 at random).
        width: chains; default 3.
        alpha: Dirichlet and Beta parameter; default 1.
        augmentation_set: ``'all'`` (default), ``'safe'`` or ``'original'``.

    Raises:
        ValueError: ``severity`` outside ``[0, 10]``, ``width < 1``, ``alpha <= 0``.
        KeyError: an unknown ``augmentation_set``.
    """

    def __init__(self, severity: int = 3, depth: int = -1, width: int = 3, alpha: float = 1.0,
                 augmentation_set: str = "all") -> None:
        super().__init__()
        from cadence.algorithms.utils.augmentation_primitives import augmentation_sets

        self.severity = _check_args(severity, depth, width, alpha, augmentation_set,
                                    "AugmentAndMixTransform")
        self.depth, self.width, self.alpha = depth, width, float(alpha)
        self.augmentation_set = augmentation_sets[augmentation_set]

    def forward(self, img: ImgT) -> ImgT:
        return augmix_image(img, self.severity, self.depth, self.width, self.alpha,
                            self.augmentation_set)


@algorithms.register("augmix")
class AugMix(Algorithm):
    """AugMix (Hendrycks et al. 2020) in the train dataset's pipeline.

    At ``FIT_START`` an :class:`AugmentAndMixTransform` is added to the train dataloader's
    dataset's ``transform`` (once per dataset), before its ``ToTensor`` step if it has one
    (:func:`~cadence.utils.misc.add_vision_dataset_transform`); each sample image (``PIL``
    or ``[C, H, W]`` tensor) is replaced by its AugMix (size and mode kept).

    Args:
        severity: intensity in ``[0, 10]``; default 3.
        depth: augmentations per chain; default -1 (1 to 3 at random per chain).
        width: chains mixed; default 3.
        alpha: the Dirichlet (chain weights) and Beta (mix with the original) parameter,
            ``> 0``; larger mixes more evenly; default 1.
        augmentation_set: ``'all'`` (default), ``'safe'`` (without the ImageNet-C
            corruptions) or ``'original'``.

    Raises:
        ValueError: ``severity`` outside ``[0, 10]``, ``width < 1``, ``alpha <= 0``.
        KeyError: an unknown ``augmentation_set``.
        TypeError: (at ``FIT_START``) the train dataloader is not a torch ``DataLoader`` or
            its dataset has no ``transform`` attribute (add :class:`AugmentAndMixTransform`
            to such a dataset yourself).

    Example (YAML)::

        algorithms:
          augmix: {severity: 3, width: 3}
    """

    events = frozenset({Event.FIT_START})

    def __init__(self, severity: int = 3, depth: int = -1, width: int = 3, alpha: float = 1.0,
                 augmentation_set: str = "all") -> None:
        self.severity = _check_args(severity, depth, width, alpha, augmentation_set, "AugMix")
        self.depth, self.width, self.alpha = depth, width, float(alpha)
        self.augmentation_set = augmentation_set
        self._transformed_datasets: weakref.WeakSet = weakref.WeakSet()

    def match(self, event: Event, state: State) -> bool:
        from cadence.algorithms.colout.colout import train_dataset

        return event == Event.FIT_START and \
            train_dataset(state, self) not in self._transformed_datasets

    def apply(self, event: Event, state: State, logger: Any) -> None:
        from cadence.algorithms.colout.colout import train_dataset

        dataset = train_dataset(state, self)
        transform = AugmentAndMixTransform(self.severity, self.depth, self.width, self.alpha,
                                           self.augmentation_set)
        add_vision_dataset_transform(dataset, transform, is_tensor_transform=False)
        self._transformed_datasets.add(dataset)
