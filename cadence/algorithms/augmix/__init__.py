"""Composer's ``composer.algorithms.augmix``: the names of :mod:`cadence.algorithms.augmix.augmix`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "AugMix": "cadence.algorithms.augmix.augmix",
    "AugmentAndMixTransform": "cadence.algorithms.augmix.augmix",
    "augmix_image": "cadence.algorithms.augmix.augmix",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
