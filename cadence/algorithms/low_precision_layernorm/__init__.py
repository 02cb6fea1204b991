"""Composer's ``composer.algorithms.low_precision_layernorm``: the names of :mod:`cadence.algorithms.low_precision_layernorm.low_precision_layernorm`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "LPLayerNorm": "cadence.algorithms.low_precision_layernorm.low_precision_layernorm",
    "LowPrecisionLayerNorm": "cadence.algorithms.low_precision_layernorm.low_precision_layernorm",
    "apply_low_precision_layernorm": "cadence.algorithms.low_precision_layernorm.low_precision_layernorm",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
