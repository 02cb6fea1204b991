"""Helpers of the algorithms (Composer's ``composer.algorithms.utils``): the ``PIL`` image
augmentations RandAugment and AugMix draw from."""

from cadence.algorithms.utils.augmentation_primitives import augmentation_sets

__all__ = ["augmentation_sets"]
