"""Composer's ``composer.algorithms.colout``: the names of :mod:`cadence.algorithms.colout.colout`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "ColOut": "cadence.algorithms.colout.colout",
    "ColOutTransform": "cadence.algorithms.colout.colout",
    "colout_batch": "cadence.algorithms.colout.colout",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
