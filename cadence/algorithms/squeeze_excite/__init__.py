"""Composer's ``composer.algorithms.squeeze_excite``: the names of :mod:`cadence.algorithms.squeeze_excite.squeeze_excite`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "SqueezeExcite": "cadence.algorithms.squeeze_excite.squeeze_excite",
    "SqueezeExcite2d": "cadence.algorithms.squeeze_excite.squeeze_excite",
    "SqueezeExciteConv2d": "cadence.algorithms.squeeze_excite.squeeze_excite",
    "apply_squeeze_excite": "cadence.algorithms.squeeze_excite.squeeze_excite",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
