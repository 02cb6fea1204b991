"""Composer's ``composer.algorithms.mixup``: the names of :mod:`cadence.algorithms.mixup.mixup`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "MixUp": "cadence.algorithms.mixup.mixup",
    "mixup_batch": "cadence.algorithms.mixup.mixup",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
