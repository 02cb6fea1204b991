"""Composer's ``composer.algorithms.cutout``: the names of :mod:`cadence.algorithms.cutout.cutout`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "CutOut": "cadence.algorithms.cutout.cutout",
    "cutout_batch": "cadence.algorithms.cutout.cutout",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
