"""Composer's ``composer.algorithms.progressive_resizing``: the names of :mod:`cadence.algorithms.progressive_resizing.progressive_resizing`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "ProgressiveResizing": "cadence.algorithms.progressive_resizing.progressive_resizing",
    "resize_batch": "cadence.algorithms.progressive_resizing.progressive_resizing",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
