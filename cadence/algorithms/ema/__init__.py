"""Composer's ``composer.algorithms.ema``: the names of :mod:`cadence.algorithms.ema.ema`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "EMA": "cadence.algorithms.ema.ema",
    "compute_ema": "cadence.algorithms.ema.ema",
    "smoothing_from_half_life": "cadence.algorithms.ema.ema",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
