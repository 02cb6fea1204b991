"""Composer's ``composer.algorithms.layer_freezing``: the names of :mod:`cadence.algorithms.layer_freezing.layer_freezing`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "LayerFreezing": "cadence.algorithms.layer_freezing.layer_freezing",
    "freeze_layers": "cadence.algorithms.layer_freezing.layer_freezing",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
