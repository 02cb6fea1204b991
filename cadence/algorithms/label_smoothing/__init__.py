"""Composer's ``composer.algorithms.label_smoothing``: the names of :mod:`cadence.algorithms.label_smoothing.label_smoothing`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "LabelSmoothing": "cadence.algorithms.label_smoothing.label_smoothing",
    "smooth_labels": "cadence.algorithms.label_smoothing.label_smoothing",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
