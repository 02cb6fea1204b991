"""Composer's ``composer.algorithms.randaugment``: the names of :mod:`cadence.algorithms.randaugment.randaugment`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "RandAugment": "cadence.algorithms.randaugment.randaugment",
    "RandAugmentTransform": "cadence.algorithms.randaugment.randaugment",
    "randaugment_image": "cadence.algorithms.randaugment.randaugment",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
