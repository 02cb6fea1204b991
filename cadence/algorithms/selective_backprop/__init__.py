"""Composer's ``composer.algorithms.selective_backprop``: the names of :mod:`cadence.algorithms.selective_backprop.selective_backprop`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "SelectiveBackprop": "cadence.algorithms.selective_backprop.selective_backprop",
    "select_using_loss": "cadence.algorithms.selective_backprop.selective_backprop",
    "should_selective_backprop": "cadence.algorithms.selective_backprop.selective_backprop",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
