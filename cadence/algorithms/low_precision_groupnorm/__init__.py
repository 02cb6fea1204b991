"""Composer's ``composer.algorithms.low_precision_groupnorm``: the names of :mod:`cadence.algorithms.low_precision_groupnorm.low_precision_groupnorm`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "LPGroupNorm": "cadence.algorithms.low_precision_groupnorm.low_precision_groupnorm",
    "LowPrecisionGroupNorm": "cadence.algorithms.low_precision_groupnorm.low_precision_groupnorm",
    "apply_low_precision_groupnorm": "cadence.algorithms.low_precision_groupnorm.low_precision_groupnorm",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
