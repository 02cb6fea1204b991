"""Composer's ``composer.algorithms.weight_standardization``: the names of :mod:`cadence.algorithms.weight_standardization.weight_standardization`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "WeightStandardization": "cadence.algorithms.weight_standardization.weight_standardization",
    "WeightStandardizer": "cadence.algorithms.weight_standardization.weight_standardization",
    "apply_weight_standardization": "cadence.algorithms.weight_standardization.weight_standardization",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
