"""Composer's ``composer.algorithms.sam``: the names of :mod:`cadence.algorithms.sam.sam`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "SAM": "cadence.algorithms.sam.sam",
    "SAMOptimizer": "cadence.algorithms.sam.sam",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
