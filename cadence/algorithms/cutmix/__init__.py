"""Composer's ``composer.algorithms.cutmix``: the names of :mod:`cadence.algorithms.cutmix.cutmix`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "CutMix": "cadence.algorithms.cutmix.cutmix",
    "cutmix_batch": "cadence.algorithms.cutmix.cutmix",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
