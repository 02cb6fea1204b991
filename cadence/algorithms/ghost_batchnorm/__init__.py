"""Composer's ``composer.algorithms.ghost_batchnorm``: the names of :mod:`cadence.algorithms.ghost_batchnorm.ghost_batchnorm`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "GhostBatchNorm": "cadence.algorithms.ghost_batchnorm.ghost_batchnorm",
    "GhostBatchNorm1d": "cadence.algorithms.ghost_batchnorm.ghost_batchnorm",
    "GhostBatchNorm2d": "cadence.algorithms.ghost_batchnorm.ghost_batchnorm",
    "GhostBatchNorm3d": "cadence.algorithms.ghost_batchnorm.ghost_batchnorm",
    "apply_ghost_batchnorm": "cadence.algorithms.ghost_batchnorm.ghost_batchnorm",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
